"""A training run's folder: what trained it, and which of its checkpoints can be trusted.

`biprm_run.json` records the configuration, a fingerprint of the encoded data and the
biprm version. Training into a folder that holds a run is refused unless `--resume`
(the same run: the record must match) or `--overwrite` (it is cleared first), so a new
run can never rotate away an old run's checkpoints or finish from them. A resume takes
the newest checkpoint that is complete and loadable, and says which.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger(__name__)
RECORD = "biprm_run.json"
# fields that change how a run is shown or stored, not what it computes
COSMETIC = ("resume", "overwrite", "show_progress", "report_to", "logging_steps", "num_proc", "save_steps", "save_total_limit")
NEEDED = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


def run_record(config: dict, data_fingerprint: str) -> dict:
    from biprm import __version__

    return {"config": {k: v for k, v in config.items() if k not in COSMETIC}, "data_fingerprint": data_fingerprint, "biprm_version": __version__}


def changes(before: dict, now: dict) -> list[str]:
    """What differs between a recorded setting and the current one, as "key: old then, new now" lines."""
    return [f"{k}: {before.get(k)!r} then, {now.get(k)!r} now" for k in dict.fromkeys([*now, *before]) if before.get(k) != now.get(k)]


def _checkpoints(folder: Path) -> list[Path]:
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]), reverse=True)


def complete(checkpoint: Path) -> str | None:
    """None if `checkpoint` has every file a resume reads and they load; else what is wrong."""
    missing = [n for n in NEEDED if not (checkpoint / n).is_file()]
    weights = list(checkpoint.glob("*.safetensors"))
    if missing or not weights:
        return f"missing {', '.join(missing + ([] if weights else ['model weights']))}"
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
        from safetensors import safe_open

        for w in weights:
            with safe_open(str(w), "pt") as f:
                f.keys()
    except Exception as error:  # a torn write: truncated JSON or weights
        return f"unreadable ({type(error).__name__}: {error})"
    return None


def finished(folder: str | Path, checkpoint: str | None) -> bool:
    """True if `checkpoint` is the run's last step and the final model is in (publish moves config.json in last)."""
    if checkpoint is None or not (Path(folder) / "config.json").is_file():
        return False
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return state.get("global_step", 0) >= state.get("max_steps", 0) > 0


def latest_complete(folder: Path) -> Path | None:
    """The newest checkpoint of `folder` that loads, or None: what a scorer can be pointed at in an unfinished run."""
    return next((c for c in _checkpoints(folder) if complete(c) is None), None)


def plan(folder: str | Path, record: dict, resume: bool, overwrite: bool) -> str | None:
    """Check the folder against this run before anything is written; the checkpoint to resume from, or None."""
    folder = Path(folder)
    saved = folder / RECORD
    holds_run = saved.is_file() or bool(_checkpoints(folder))
    if not holds_run or overwrite:
        if resume and not holds_run:
            log.warning("--resume: %s holds no run yet; training from the start", folder)
        return None
    if not resume:
        raise FileExistsError(f"{folder} holds a training run; add --resume to continue it or --overwrite to replace it")
    if saved.is_file():
        before = json.loads(saved.read_text())
        diff = changes(before["config"], record["config"])
        if before.get("data_fingerprint") != record["data_fingerprint"]:
            diff.append("the training data differ")
        if diff:
            raise ValueError(f"--resume: {folder} holds another run ({'; '.join(diff)}); use another --output-dir or --overwrite")
    else:
        raise FileExistsError(f"--resume: {folder} has checkpoints but no {RECORD} saying which run wrote them; use --overwrite or another folder")
    for checkpoint in _checkpoints(folder):
        problem = complete(checkpoint)
        if problem is None:
            log.warning("resuming from %s", checkpoint)
            return str(checkpoint)
        log.warning("skipping %s: %s", checkpoint, problem)
    log.warning("--resume: no complete checkpoint in %s; training from the start", folder)
    return None


def start(folder: str | Path, record: dict, overwrite: bool) -> None:
    """Clear the folder for --overwrite, then write the record (main process only)."""
    folder = Path(folder)
    if overwrite:
        for p in _checkpoints(folder):
            shutil.rmtree(p)
        for p in (folder / RECORD, folder / "config.json"):
            p.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD).write_text(json.dumps(record, indent=2))


@contextmanager
def undone_if_nothing_trained(folder: str | Path, created: bool, steps: Callable[[], int]) -> Iterator[None]:
    """Remove the record this run wrote if it fails before its first optimizer step and checkpoint, so that
    the same command can run again without --resume or --overwrite (there is nothing to resume)."""
    try:
        yield
    except BaseException:
        if created and steps() == 0 and not _checkpoints(Path(folder)):
            (Path(folder) / RECORD).unlink(missing_ok=True)
        raise


def publish(scratch: str | Path, folder: str | Path) -> None:
    """Move a finished save into `folder` file by file, config.json last: a kill part-way leaves a folder
    that loaders reject as incomplete ("config.json is missing"), never one that loads half-new weights."""
    scratch, folder = Path(scratch), Path(folder)
    (folder / "config.json").unlink(missing_ok=True)
    files = sorted((p for p in scratch.rglob("*") if p.is_file()), key=lambda p: p.name == "config.json")
    for p in files:
        target = folder / p.relative_to(scratch)
        target.parent.mkdir(parents=True, exist_ok=True)
        p.replace(target)
    shutil.rmtree(scratch)
