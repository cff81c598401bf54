"""`python -m studies.replication --config studies/replication/full.yaml [--report-only]`: resumable, rerun to
continue."""

from biprm.cli import run_program
from studies.replication.config import ReplicateConfig


def main(cfg: ReplicateConfig) -> None:
    from studies.replication.recipe import replicate, report_only

    if cfg.report_only:
        report_only(cfg)
        return
    try:
        replicate(cfg)
    except KeyboardInterrupt:  # the one line run_program prints says what is kept
        raise KeyboardInterrupt(kept(cfg)) from None


def kept(cfg: ReplicateConfig) -> str:
    """What an interrupted study keeps, and how it goes on."""
    from pathlib import Path

    from studies.replication.recipe import runs_of

    done = len(list(Path(cfg.out, "runs").glob("*.json")))
    return (
        f"{done} of {len(runs_of(cfg))} runs are finished in {cfg.out}/runs, and the trunk caches built so far are in "
        f"{cfg.work_dir}/trunk: the same command goes on from there"
    )


if __name__ == "__main__":
    run_program(ReplicateConfig, main, "python -m studies.replication")
