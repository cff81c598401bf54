"""`python -m studies.mechanism --config studies/mechanism/v2.yaml [--report-only]`: resumable, rerun to continue."""

from biprm.cli import run_program
from studies.mechanism.config import MechanismConfig


def main(cfg: MechanismConfig) -> None:
    from studies.mechanism.study import run_study, write_report

    write_report(cfg) if cfg.report_only else run_study(cfg)


if __name__ == "__main__":
    run_program(MechanismConfig, main, "python -m studies.mechanism")
