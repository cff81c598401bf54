"""A training run's folder: what trained it, and which of its checkpoints can be trusted.

`biprm_run.json` records the configuration, a fingerprint of the encoded data and the
biprm version. Training into a folder that holds a run is refused unless `--resume`
(the same run: the record must match) or `--overwrite` (it is cleared first), so a new
run can never rotate away an old run's checkpoints or finish from them. The record
compares the global batch, not its split into processes, micro-batches and accumulation,
so a run may resume in another number of processes.

A resume takes the newest checkpoint that is complete by the rules of the backend that
wrote it (`judge`), and says which. The Trainer writes `trainer_state.json` last, after
every rank's files: a checkpoint without it whole was cut short and is skipped; one with
it that lacks what its backend's resume reads cannot be judged, which is an error, never a
silent restart from step 0 (whose checkpoint rotation would then delete the run's state).
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
SPLIT = ("per_device_train_batch_size", "gradient_accumulation_steps")  # with the world size: how the global batch is split


def run_record(config: dict, data_fingerprint: str, world_size: int = 1) -> dict:
    from biprm import __version__

    return {"config": {k: v for k, v in config.items() if k not in COSMETIC}, "world_size": world_size,
            "data_fingerprint": data_fingerprint, "biprm_version": __version__}


def computed(record: dict) -> dict:
    """The record's config as what the run computes: the global batch in place of its split
    (a record written before the world size was kept is from one process)."""
    config = {k: v for k, v in record["config"].items() if k not in SPLIT}
    config["global_batch_size"] = record.get("world_size", 1) * record["config"]["per_device_train_batch_size"] * record["config"]["gradient_accumulation_steps"]
    return config


def changes(before: dict, now: dict) -> list[str]:
    """What differs between a recorded setting and the current one, as "key: old then, new now" lines."""
    return [f"{k}: {before.get(k)!r} then, {now.get(k)!r} now" for k in dict.fromkeys([*now, *before]) if before.get(k) != now.get(k)]


def _checkpoints(folder: Path) -> list[Path]:
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]), reverse=True)


def _state(checkpoint: Path) -> dict | None:
    """trainer_state.json, or None if it is missing or torn."""
    try:
        return json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None


def backend_of(checkpoint: Path) -> str | None:
    """Which backend wrote `checkpoint`, told by where it keeps the optimizer state; None if nowhere biprm knows."""
    names = {p.name for p in checkpoint.iterdir()}
    if "latest" in names or any(n.startswith("global_step") for n in names):
        return "deepspeed"  # DeepSpeed's save_checkpoint: global_stepN/ with every rank's shards, then `latest` naming it
    if "optimizer.bin" in names or any(n.startswith(("optimizer_", "pytorch_model_fsdp")) for n in names):
        return "fsdp"  # accelerate's FSDP save: full state dicts (.bin) or torch.distributed.checkpoint folders
    return "plain" if "optimizer.pt" in names else None


def _zero_ranks(step: Path, kind: str) -> set[int]:
    """The ranks whose ZeRO `kind` file (optim_states, or model_states under ZeRO-3) a DeepSpeed step folder holds."""
    return {int(re.search(r"zero_pp_rank_(\d+)_", p.name)[1]) for p in step.glob(f"*zero_pp_rank_*_{kind}.pt")}


def zero_shards(checkpoint: Path) -> int:
    """How many processes' ZeRO shards a DeepSpeed checkpoint holds (0 without ZeRO)."""
    step = checkpoint / (checkpoint / "latest").read_text().strip()
    return max(_zero_ranks(step, "optim_states") | _zero_ranks(step, "model_states"), default=-1) + 1


def _lacks(checkpoint: Path, backend: str) -> list[str]:
    """What a resume by `backend` reads (the Trainer's `_load_from_checkpoint`, `_load_optimizer_and_scheduler`
    and DeepSpeed's `load_checkpoint`) and `checkpoint` does not hold."""
    def has(*names: str) -> bool:
        return any((checkpoint / n).exists() for n in names)

    lacks = [] if has("trainer_state.json") else ["trainer_state.json"]
    if backend == "plain":
        lacks += [n for n in ("optimizer.pt", "scheduler.pt") if not has(n)] + ([] if any(checkpoint.glob("*.safetensors")) else ["model weights"])
    elif backend == "fsdp":  # a sharded state is whole once torch.distributed.checkpoint has written its .metadata, last
        lacks += [] if has("pytorch_model_fsdp.bin", "pytorch_model_fsdp_0/.metadata") else ["pytorch_model_fsdp.bin or pytorch_model_fsdp_0/"]
        lacks += [] if has("optimizer.bin", "optimizer_0/.metadata") else ["optimizer.bin or optimizer_0/"]
        lacks += [] if has("scheduler.pt") else ["scheduler.pt"]
    else:
        tag = (checkpoint / "latest").read_text().strip() if has("latest") else ""
        step = checkpoint / tag
        if not tag or not step.is_dir():
            return lacks + [f"the step folder that `latest` names ({tag or 'latest is missing or empty'})"]
        optim, model, world = _zero_ranks(step, "optim_states"), _zero_ranks(step, "model_states"), zero_shards(checkpoint)
        if not model and not any(step.glob("mp_rank_*_model_states.pt")):
            lacks.append(f"{tag}/*model_states.pt")
        lacks += [f"{tag}/ rank {r}'s ZeRO optimizer shard" for r in range(world) if r not in optim]
        lacks += [f"{tag}/ rank {r}'s ZeRO-3 model shard" for r in range(world) if model and r not in model]
    return lacks


def judge(checkpoint: Path) -> tuple[str | None, str | None]:
    """(the backend that wrote `checkpoint`, None if it holds whole every file that backend's resume reads, else what is wrong)."""
    backend = backend_of(checkpoint)
    if backend is None:
        return None, "no optimizer state (optimizer.pt; DeepSpeed's latest and global_stepN/; FSDP's optimizer.bin or optimizer_0/)"
    lacks = _lacks(checkpoint, backend)
    if lacks:
        return backend, f"missing {', '.join(lacks)}"
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
        from safetensors import safe_open

        for w in checkpoint.glob("*.safetensors"):
            with safe_open(str(w), "pt") as f:
                f.keys()
    except Exception as error:  # a torn write: truncated JSON or weights
        return backend, f"unreadable ({type(error).__name__}: {error})"
    return backend, None


def finished(folder: str | Path, checkpoint: str | None) -> bool:
    """True if `checkpoint` is the run's last step and the final model is in (publish moves config.json in last)."""
    if checkpoint is None or not (Path(folder) / "config.json").is_file():
        return False
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return state.get("global_step", 0) >= state.get("max_steps", 0) > 0


def latest_complete(folder: Path) -> Path | None:
    """The newest complete checkpoint of `folder` with whole weights, or None: what a scorer can be pointed at in an
    unfinished run (a sharded FSDP checkpoint has none)."""
    return next((c for c in _checkpoints(folder) if judge(c)[1] is None and any(c.glob("*.safetensors"))), None)


def plan(folder: str | Path, record: dict, resume: bool, overwrite: bool, backend: str = "plain") -> str | None:
    """Check the folder against this run (trained by `backend`, in `record["world_size"]` processes) before anything
    is written; the checkpoint to resume from, or None."""
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
        diff = changes(computed(before), computed(record))
        if before.get("data_fingerprint") != record["data_fingerprint"]:
            diff.append("the training data differ")
        if diff:
            raise ValueError(f"--resume: {folder} holds another run ({'; '.join(diff)}); use another --output-dir or --overwrite")
    else:
        raise FileExistsError(f"--resume: {folder} has checkpoints but no {RECORD} saying which run wrote them; use --overwrite or another folder")
    for checkpoint in _checkpoints(folder):
        written_by, problem = judge(checkpoint)
        if problem is None:
            check_resumable(checkpoint, written_by, backend, record["world_size"])
            log.warning("resuming from %s", checkpoint)
            return str(checkpoint)
        if _state(checkpoint) is not None:
            raise ValueError(f"--resume: {checkpoint} cannot be judged: {problem}, though its save finished (trainer_state.json, "
                             "written last, is whole); remove it to resume from an older checkpoint, or use --overwrite")
        log.warning("skipping %s: %s", checkpoint, problem)
    log.warning("--resume: no complete checkpoint in %s; training from the start", folder)
    return None


def check_resumable(checkpoint: Path, written_by: str, backend: str, world_size: int) -> None:
    """Refuse a checkpoint this run's backend would load only in part (the Trainer reads another backend's
    optimizer state silently as none), or, for DeepSpeed's ZeRO shards, in another number of processes."""
    names = {"plain": "one process or DDP", "deepspeed": "DeepSpeed", "fsdp": "FSDP"}
    if written_by != backend:
        raise ValueError(f"--resume: {checkpoint} was written by {names[written_by]} and this run trains with {names[backend]}; "
                         "resume it with the launcher and config that wrote it")
    shards = zero_shards(checkpoint) if backend == "deepspeed" else 0
    if shards and shards != world_size:
        raise ValueError(f"--resume: {checkpoint} holds DeepSpeed ZeRO state in {shards} shards, one per process, and DeepSpeed "
                         f"reads them rank by rank; resume it in {shards} processes, not {world_size}")


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
