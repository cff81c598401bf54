"""`python -m studies.rl --config studies/rl/study.yaml [--report-only]`: resumable, rerun to continue."""

from biprm.cli import run_program
from studies.rl.config import RLStudyConfig


def main(cfg: RLStudyConfig) -> None:
    from biprm.config import check_extras

    check_extras({"trl": "python -m studies.rl"})
    from studies.rl.study import run_study, write_report

    print(write_report(cfg)) if cfg.report_only else run_study(cfg)


if __name__ == "__main__":
    run_program(RLStudyConfig, main, "python -m studies.rl")
