"""`biprm eval {bon,processbench,ablations,all}`: each sub-command's settings dataclass -> its recipe.

The recipes are imported when a command runs, so that building the parser (and `--help`) stays cheap.
Under `accelerate launch` or `torchrun` the recipe runs on the main process and the
others share its scoring (biprm.evaluation.sharing).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from biprm.evaluation.config import AblationConfig, BonConfig, EvalOptions, ProcessBenchConfig, SuiteConfig


def models_of(cfg: EvalOptions) -> list[str]:
    """Every model folder a command names: --model (one or several), the ablation roles and `eval all`'s
    ROLE=CKPT."""
    given = getattr(cfg, "model", None) or []
    return (
        ([given] if isinstance(given, str) else list(given))
        + [a.partition("=")[2] for a in getattr(cfg, "ablation", [])]
        + list(getattr(cfg, "checkpoints", {}).values())
    )


def check_models(cfg: EvalOptions) -> None:
    """Refuse a model that is not there before anything is graded, scored or written (a typo used to cost the whole
    grading pass and leave its cache and an empty output folder): a local folder must be one biprm reads, and any
    other name must be a Hub id, owner/name."""
    from biprm.folder import NotACheckpoint, resolve

    for path in models_of(cfg):
        if "/" not in path and not Path(path).expanduser().exists():
            raise NotACheckpoint(f"{path}: no such folder (and not a Hugging Face model id, owner/name)")
        resolve(path, cfg.prm_kind, None, cfg.prm_reference)


def _on_every_process(recipe: Callable[[EvalOptions], object], cfg: EvalOptions) -> None:
    check_models(cfg)
    from biprm.evaluation.cache import ScoringStopped, scorer_loader
    from biprm.evaluation.outputs import open_cache
    from biprm.evaluation.sharing import run_shared
    from biprm.scoring.process_group import close_processes, process_state

    try:
        run_shared(lambda: recipe(cfg), scorer_loader(cfg))
    except Exception:
        # the main process has told the others to stop, so each reaches close_processes too; any other process that
        # fails leaves at once (the main one may be waiting on it), and closing must not hide the error being raised
        if process_state().is_main_process:
            with suppress(Exception):
                close_processes()
        raise
    except ScoringStopped as stop:
        raise KeyboardInterrupt(str(stop)) from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"stopped between scorings: every model's scores finished so far are kept in {open_cache(cfg).root}, "
            "whole; the same command reads them instead of scoring again"
        ) from None
    close_processes()


def cmd_bon(cfg: BonConfig) -> None:
    from biprm.evaluation.bon import run_bon

    _on_every_process(run_bon, cfg)


def cmd_processbench(cfg: ProcessBenchConfig) -> None:
    from biprm.evaluation.processbench import run_processbench

    _on_every_process(run_processbench, cfg)


def cmd_ablations(cfg: AblationConfig) -> None:
    from biprm.evaluation.ablations import run_ablations

    _on_every_process(run_ablations, cfg)


def cmd_all(cfg: SuiteConfig) -> None:
    from biprm.evaluation.suite import run_suite

    _on_every_process(run_suite, cfg)


HELP = "Best-of-N, ProcessBench, ablations and the paper's analyses (see docs/EVALUATION.md)"
COMMANDS = {  # name: (settings, recipe, one-line help), as in biprm.cli
    "bon": (BonConfig, cmd_bon, "Best-of-N@n beside the scorers that read no text, with intervals over questions"),
    "processbench": (ProcessBenchConfig, cmd_processbench, "first-error F1 per ProcessBench subset"),
    "ablations": (AblationConfig, cmd_ablations, "the paper's ablation table from separately trained checkpoints"),
    "all": (SuiteConfig, cmd_all, "every protocol and analysis; writes report.md, results.json and figures"),
}
