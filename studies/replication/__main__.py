"""`python -m studies.replication --config studies/replication/full.yaml [--report-only]`: resumable, rerun to
continue."""

from biprm.cli import run_program
from studies.replication.config import ReplicateConfig


def main(cfg: ReplicateConfig) -> None:
    from studies.replication.recipe import replicate, report_only

    report_only(cfg) if cfg.report_only else replicate(cfg)


if __name__ == "__main__":
    run_program(ReplicateConfig, main, "python -m studies.replication")
