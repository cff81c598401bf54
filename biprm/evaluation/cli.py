"""`biprm eval {bon,processbench,ablations,all}`: each sub-command's settings dataclass -> its recipe.

The recipes are imported when a command runs, so that building the parser (and `--help`) stays cheap.
Under `accelerate launch` or `torchrun` the recipe runs on the main process and the
others share its scoring (biprm.evaluation.sharing).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict
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


# what each command writes in --out beside its record, COMMAND.run.json: all that its --overwrite deletes
RESULTS = {
    "bon": r"bon\.(json|md)",
    "processbench": r"processbench\.(json|md)",
    "ablations": r"ablations\.(json|md)",
    "all": r"report\.md|results\.json|cases\.(md|html)|mae_by_position\.png|sigma_by_position(_\d+)?\.png",
}
SHARED = r"cache|\..*\.tmp"  # the score cache every command reads, and a killed atomic write's scratch file
THROUGHPUT = ("out", "cache_dir", "overwrite", "grade_workers", "tokens_per_batch", "tokens_per_call", "tokens_per_row")


def recorded_settings(cfg: EvalOptions) -> dict:
    """What a command's results depend on, as its record keeps it: every setting but where it writes and how fast it
    runs, local paths resolved (`runs/bi` and `./runs/bi` are one model)."""

    def local(value: object) -> object:
        if isinstance(value, (list, tuple)):
            return [local(v) for v in value]
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        if isinstance(value, str) and value and Path(value).expanduser().exists():
            return str(Path(value).expanduser().resolve())
        return value

    return json.loads(json.dumps({k: local(v) for k, v in asdict(cfg).items() if k not in THROUGHPUT}, default=str))


def claim_out(cfg: EvalOptions, command: str) -> None:
    """Check --out before anything is read or scored (every process alike, so that all stop together): it may hold
    the score cache and any eval command's results; this command's own results are refused unless its record says
    they were written with these settings (a rerun resumes from the cache and rewrites them the same) or --overwrite
    deletes them. The first process then writes the record (before any result: `eval all` writes figures as it goes)."""
    from biprm.data.writer import atomic_write
    from biprm.run_folder import changes, claim_results

    out, settings = Path(cfg.out), recorded_settings(cfg)
    record = out / f"{command}.run.json"
    before = json.loads(record.read_text()) if record.is_file() else None
    differs = None if before == settings else "; ".join(changes(before, settings)) if before else f"no {record.name}"
    main = os.environ.get("RANK", "0") == "0"
    cache = Path(cfg.cache_dir or out / "cache").resolve()
    shared = [SHARED, re.escape(cache.name)] if cache.parent == out.resolve() else [SHARED]
    known = re.compile("|".join([*shared, *(f"{c}\\.run\\.json|{r}" for c, r in RESULTS.items())]))
    mine = re.compile(RESULTS[command])  # a record alone (a run that failed before its results) is just replaced
    claim_results(
        out, f"biprm eval {command}", known, mine, differs if main or not cfg.overwrite else None, cfg.overwrite
    )
    if main and before != settings:
        atomic_write(record, lambda f: f.write(json.dumps(settings, indent=1).encode()))


def _on_every_process(recipe: Callable[[EvalOptions], object], cfg: EvalOptions, command: str) -> None:
    check_models(cfg)
    claim_out(cfg, command)
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

    _on_every_process(run_bon, cfg, "bon")


def cmd_processbench(cfg: ProcessBenchConfig) -> None:
    from biprm.evaluation.processbench import run_processbench

    _on_every_process(run_processbench, cfg, "processbench")


def cmd_ablations(cfg: AblationConfig) -> None:
    from biprm.evaluation.ablations import run_ablations

    _on_every_process(run_ablations, cfg, "ablations")


def cmd_all(cfg: SuiteConfig) -> None:
    from biprm.evaluation.suite import run_suite

    _on_every_process(run_suite, cfg, "all")


HELP = "Best-of-N, ProcessBench, ablations and the paper's analyses (see docs/EVALUATION.md)"
COMMANDS = {  # name: (settings, recipe, one-line help), as in biprm.cli
    "bon": (BonConfig, cmd_bon, "Best-of-N@n beside the scorers that read no text, with intervals over questions"),
    "processbench": (ProcessBenchConfig, cmd_processbench, "first-error F1 per ProcessBench subset"),
    "ablations": (AblationConfig, cmd_ablations, "the paper's ablation table from separately trained checkpoints"),
    "all": (SuiteConfig, cmd_all, "every protocol and analysis; writes report.md, results.json and figures"),
}
