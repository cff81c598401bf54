"""A training run's folder: what trained it, and which of its checkpoints can be trusted.

`biprm_run.json` records the configuration, a fingerprint of the encoded data and the
biprm version. Training into a folder that holds a run is refused unless `--resume`
(the same run: the record must match) or `--overwrite` (it is cleared first), so a new
run can never rotate away an old run's checkpoints or finish from them. A folder holding a model
but no record (one copied from elsewhere, or a run of an older biprm) counts as a run's output: it is
refused the same way, and `--overwrite` deletes exactly the files it names. A folder holding files
no run writes is refused even with `--overwrite`, which never deletes them. `--resume` on an empty
folder trains from the start and says so (a job script that always passes it works on its first
submission). The record
compares the global batch, not its split into processes, micro-batches and accumulation,
so a run may resume in another number of processes. Paths are compared as the files they name, not as typed:
`runs/a`, `./runs/a` and `/home/me/runs/a` are one folder, from any working directory.

A resume takes the newest checkpoint that is complete by the rules of the backend that
wrote it (`judge`), and says which. The Trainer writes `trainer_state.json` last, after
every rank's files: a checkpoint without it whole was cut short and is skipped; one with
it that lacks what its backend's resume reads cannot be judged, which is an error, never a
silent restart from step 0 (whose checkpoint rotation would then delete the run's state). What a DeepSpeed
checkpoint must hold comes from the record (its process count and ZeRO stage), not from the files present, so a
checkpoint missing its last rank's files is named as such. Every refusal that advises `--overwrite` says what
it deletes.
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
# fields that change how or where a run is shown or stored, not what it computes (the record lives in its output folder)
COSMETIC = (
    "resume",
    "overwrite",
    "show_progress",
    "report_to",
    "logging_steps",
    "num_proc",
    "save_steps",
    "save_total_limit",
    "output_dir",
    "trunk_cache_dir",
)
PATHS = (
    "data",
    "backbone",
    "init_from",
    "deepspeed",
)  # every setting that may name a local file or folder: compared as that file, resolved
# what a training run or a model folder holds (checkpoints, a model's config, weights, adapter and tokenizer, a LoRA
# run's adapter/ folder, an export's value head, the run's record, log and card, the final save's scratch folder,
# TensorBoard's logs): all that --overwrite deletes
OUTPUT = re.compile(
    r"checkpoint-\d+|\.final|runs|adapter|biprm_(run|train)\.json|train_log\.json|README\.md|training_args\.bin"
    r"|(generation_|adapter_|preprocessor_)?config\.json|.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?"
    r"|adapter_model\..*|biprm_head\..*|tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)"
    r"|merges\.txt|chat_template\..*|(all|train|eval)_results\.json|trainer_state\.json|\.gitattributes|LICENSE.*"
)
MODEL = re.compile(r"(adapter_)?config\.json|.*\.safetensors|pytorch_model.*\.bin|adapter_model\..*")  # a model's own
SPLIT = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)  # with the world size: how the global batch is split


def run_record(config: dict, data_fingerprint: str | None, world_size: int = 1, engine: dict | None = None) -> dict:
    """What trained a run: its settings (local paths resolved), its data (None until encoded), its process count and,
    as `engine`, its backend with what a DeepSpeed checkpoint of it holds (`engine_facts`)."""
    from biprm import __version__

    return {
        "config": resolved({k: v for k, v in config.items() if k not in COSMETIC}),
        "world_size": world_size,
        "engine": engine or {"backend": "plain"},
        "data_fingerprint": data_fingerprint,
        "biprm_version": __version__,
    }


def resolved(config: dict) -> dict:
    """`config` with every setting of PATHS that names an existing local file or folder as its absolute path."""

    def local(value: object) -> bool:
        return isinstance(value, str) and bool(value) and Path(value).expanduser().exists()

    return {k: str(Path(v).expanduser().resolve()) if k in PATHS and local(v) else v for k, v in config.items()}


def computed(record: dict) -> dict:
    """The record's config as what the run computes: local paths resolved (a record from before they were is read from
    here), the global batch in place of its split (a record written before the world size was kept is from one
    process)."""
    config = {k: v for k, v in resolved(record["config"]).items() if k not in SPLIT and k not in COSMETIC}
    config["global_batch_size"] = (
        record.get("world_size", 1)
        * record["config"]["per_device_train_batch_size"]
        * record["config"]["gradient_accumulation_steps"]
    )
    return config


def changes(before: dict, now: dict) -> list[str]:
    """What differs between a recorded setting and the current one, as "key: old then, new now" lines."""
    return [
        f"{k}: {before.get(k)!r} then, {now.get(k)!r} now"
        for k in dict.fromkeys([*now, *before])
        if before.get(k) != now.get(k)
    ]


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
        return (
            "deepspeed"  # DeepSpeed's save_checkpoint: global_stepN/ with every rank's shards, then `latest` naming it
        )
    if "optimizer.bin" in names or any(n.startswith(("optimizer_", "pytorch_model_fsdp")) for n in names):
        return "fsdp"  # accelerate's FSDP save: full state dicts (.bin) or torch.distributed.checkpoint folders
    return "plain" if "optimizer.pt" in names else None


def _zero_ranks(step: Path, kind: str) -> set[int]:
    """The ranks whose ZeRO `kind` file (optim_states, or model_states under ZeRO-3) a DeepSpeed step folder holds."""
    return {int(re.search(r"zero_pp_rank_(\d+)_", p.name)[1]) for p in step.glob(f"*zero_pp_rank_*_{kind}.pt")}


def _saved(folder: Path) -> dict | None:
    """The run record `folder` holds, or None."""
    path = folder / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def deepspeed_layout(checkpoint: Path, record: dict | None) -> tuple[int, int]:
    """(processes, ZeRO stage) a DeepSpeed checkpoint was written by: from the run record where it says, else guessed
    from the files present (the highest rank, ZeRO-3 if ranks hold model shards), for folders without one."""
    engine = (record or {}).get("engine", {})
    step = checkpoint / (checkpoint / "latest").read_text().strip()
    optim, model = _zero_ranks(step, "optim_states"), _zero_ranks(step, "model_states")
    if engine.get("backend") == "deepspeed":
        stage = engine.get("zero_stage")
        return record["world_size"], (3 if model else 2) if stage is None else stage
    return max(optim | model, default=-1) + 1, 3 if model else 2


def _deepspeed_lacks(checkpoint: Path, record: dict | None) -> list[str]:
    """What DeepSpeed's `load_checkpoint` and the Trainer read from a DeepSpeed checkpoint and `checkpoint` does not
    hold: every rank's optimizer shard (ZeRO >= 1) and, under ZeRO-3, model shard; the whole model states below ZeRO-3;
    the Trainer's scheduler.pt unless the DeepSpeed config builds its own scheduler."""
    latest = checkpoint / "latest"
    tag = latest.read_text().strip() if latest.is_file() else ""
    step = checkpoint / tag
    if not tag or not step.is_dir():
        return [f"the step folder that `latest` names ({tag or 'latest is missing or empty'})"]
    world, stage = deepspeed_layout(checkpoint, record)
    optim, model = _zero_ranks(step, "optim_states"), _zero_ranks(step, "model_states")
    shard = "{tag}/{prefix}zero_pp_rank_{rank}_mp_rank_00_{kind}.pt"  # named as on disk
    lacks = [
        shard.format(tag=tag, prefix="", rank=r, kind="model_states")
        for r in range(world)
        if stage == 3 and r not in model
    ]
    if stage < 3 and not (step / "mp_rank_00_model_states.pt").is_file():
        lacks.append(f"{tag}/mp_rank_00_model_states.pt")
    prefix = _optim_prefix(step, record)
    lacks += [
        shard.format(tag=tag, prefix=prefix, rank=r, kind="optim_states")
        for r in range(world)
        if stage >= 1 and r not in optim
    ]
    if not (record or {}).get("engine", {}).get("scheduler_in_config") and not (checkpoint / "scheduler.pt").is_file():
        lacks.append("scheduler.pt")
    return lacks


def _optim_prefix(step: Path, record: dict | None) -> str:
    """How DeepSpeed prefixes the optimizer shards' names: 'bf16_' in its bf16 mode (as the files present or the run's
    --bf16 say), else nothing; the model shards never carry it."""
    bf16 = any(step.glob("bf16_zero_pp_rank_*_optim_states.pt")) or bool((record or {}).get("config", {}).get("bf16"))
    return "bf16_" if bf16 else ""


def _deepspeed_surplus(checkpoint: Path, record: dict | None) -> str | None:
    """What a DeepSpeed checkpoint holds beyond the processes its run record names (another run's shards, or a record
    rewritten since), or None: its ranks would not line up with the record's on a resume."""
    if (record or {}).get("engine", {}).get("backend") != "deepspeed":
        return None  # the process count is read from the files themselves
    step = checkpoint / (checkpoint / "latest").read_text().strip()
    ranks = _zero_ranks(step, "optim_states") | _zero_ranks(step, "model_states")
    if max(ranks, default=-1) < record["world_size"]:
        return None
    return (
        f"holds the shards of {max(ranks) + 1} processes and {RECORD} says {record['world_size']} wrote it, so they "
        "are another run's"
    )


def _lacks(checkpoint: Path, backend: str, record: dict | None) -> list[str]:
    """What a resume by `backend` reads (the Trainer's `_load_from_checkpoint`, `_load_optimizer_and_scheduler`
    and DeepSpeed's `load_checkpoint`) and `checkpoint` does not hold."""

    def has(*names: str) -> bool:
        return any((checkpoint / n).exists() for n in names)

    lacks = [] if has("trainer_state.json") else ["trainer_state.json"]
    if backend == "plain":
        lacks += [n for n in ("optimizer.pt", "scheduler.pt") if not has(n)] + (
            [] if any(checkpoint.glob("*.safetensors")) else ["model weights"]
        )
    elif (
        backend == "fsdp"
    ):  # a sharded state is whole once torch.distributed.checkpoint has written its .metadata, last
        lacks += (
            []
            if has("pytorch_model_fsdp.bin", "pytorch_model_fsdp_0/.metadata")
            else ["pytorch_model_fsdp.bin or pytorch_model_fsdp_0/"]
        )
        lacks += [] if has("optimizer.bin", "optimizer_0/.metadata") else ["optimizer.bin or optimizer_0/"]
        lacks += [] if has("scheduler.pt") else ["scheduler.pt"]
    else:
        lacks += _deepspeed_lacks(checkpoint, record)
    return lacks


def judge(checkpoint: Path, record: dict | None = None) -> tuple[str | None, str | None]:
    """(the backend that wrote `checkpoint`, None if it holds whole every file that backend's resume reads, else what is
    wrong); `record`, the run's, says what a DeepSpeed checkpoint must hold."""
    backend = backend_of(checkpoint)
    if backend is None:
        return (
            None,
            "no optimizer state (optimizer.pt; DeepSpeed's latest and global_stepN/; FSDP's optimizer.bin or "
            "optimizer_0/)",
        )
    lacks = _lacks(checkpoint, backend, record)
    if lacks:
        return backend, f"missing {', '.join(lacks)}"
    surplus = _deepspeed_surplus(checkpoint, record) if backend == "deepspeed" else None
    if surplus:
        return backend, surplus
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
    record = _saved(folder)
    return next((c for c in _checkpoints(folder) if judge(c, record)[1] is None and any(c.glob("*.safetensors"))), None)


def kept(folder: str | Path) -> str:
    """What an interrupted run leaves in `folder` and how to go on, in one line: the checkpoint a --resume would
    take."""
    folder = Path(folder)
    record = _saved(folder)
    newest = next((c for c in _checkpoints(folder) if judge(c, record)[1] is None), None)
    if newest is None:
        return f"no checkpoint in {folder} yet: the same command with --resume starts it again"
    return f"{newest} is saved: the same command with --resume goes on from its step {newest.name.split('-')[1]}"


def contents(folder: Path) -> tuple[list[str], list[str]]:
    """(what a run or a model wrote in `folder`, which `--overwrite` deletes: checkpoints in step order, then the other
    files; every other name in it, which biprm never deletes), by name."""
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    steps = [p.name for p in reversed(_checkpoints(folder))]
    ours = [n for n in names if OUTPUT.fullmatch(n) and n not in steps]
    return steps + ours, [n for n in names if not OUTPUT.fullmatch(n)]


def overwrite_deletes(folder: Path) -> str:
    """What `--overwrite` deletes in `folder`, named wherever it is offered or done: a run's checkpoints are its trained
    steps, then every file of its model, log and record."""
    steps = [p.name for p in reversed(_checkpoints(folder))]
    rest = [n for n in contents(folder)[0] if n not in steps and n != RECORD]
    named = [f"{', '.join(steps)} (the run's trained steps)"] if steps else []
    return ", ".join([*named, *rest, *([RECORD] if (folder / RECORD).is_file() else [])])


def plan(folder: str | Path, record: dict, resume: bool, overwrite: bool, backend: str = "plain") -> str | None:
    """Check the folder against this run (trained by `backend`, in `record["world_size"]` processes) before anything
    is written or loaded; the checkpoint to resume from, or None. The data are compared later (`same_data`)."""
    folder = Path(folder)
    if resume and overwrite:
        raise ValueError(f"--resume continues the run in {folder} and --overwrite deletes it; choose one")
    saved = _saved(folder)
    holds_run = saved is not None or bool(_checkpoints(folder))
    ours, others = contents(folder)
    if others and not (resume and holds_run):
        raise FileExistsError(
            f"{folder} holds {', '.join(others)}, which no training run writes; train into a new or empty "
            "--output-dir (--overwrite deletes only a run's or a model's files)"
        )
    overwrite_does = f"--overwrite, which deletes {overwrite_deletes(folder)}"
    if not ours or overwrite:
        if resume:
            log.warning("--resume: %s holds no run yet; training from the start", folder)
        return None
    if not holds_run:
        what = "a model" if any(MODEL.fullmatch(n) for n in ours) else "a run's files"
        raise FileExistsError(
            f"{folder} holds {what} ({', '.join(ours)}) and no {RECORD} saying which run wrote it"
            f"{', so there is nothing to --resume' if resume else ''}; train into another --output-dir, or "
            f"{overwrite_does}"
        )
    if not resume:
        raise FileExistsError(f"{folder} holds a training run; add --resume to continue it, or {overwrite_does}")
    if saved is None:
        raise FileExistsError(
            f"--resume: {folder} has checkpoints but no {RECORD} saying which run wrote them; "
            f"train into another --output-dir, or {overwrite_does}"
        )
    diff = changes(computed(saved), computed(record))
    if diff:
        raise ValueError(
            f"--resume: {folder} holds another run ({'; '.join(diff)}); train into another --output-dir, or "
            f"{overwrite_does}"
        )
    for checkpoint in _checkpoints(folder):
        written_by, problem = judge(checkpoint, saved)
        if problem is None:
            check_resumable(checkpoint, written_by, backend, record["world_size"], saved)
            log.warning("resuming from %s", checkpoint)
            return str(checkpoint)
        if _state(checkpoint) is not None:
            raise ValueError(
                f"--resume: {checkpoint} cannot be judged: {problem}, though its save finished (trainer_state.json, "
                f"written last, is whole); remove it to resume from an older checkpoint, or {overwrite_does}"
            )
        log.warning("skipping %s: %s", checkpoint, problem)
    log.warning("--resume: no complete checkpoint in %s; training from the start", folder)
    return None


def same_data(folder: str | Path, fingerprint: str) -> None:
    """Refuse to resume a run recorded on other data: the one check that needs the data encoded, so it comes after
    loading."""
    saved = _saved(Path(folder))
    if saved is not None and saved.get("data_fingerprint") not in (None, fingerprint):
        raise ValueError(
            f"--resume: {folder} holds another run (the training data differ); train into another --output-dir, "
            f"or --overwrite, which deletes {overwrite_deletes(Path(folder))}"
        )


def check_resumable(
    checkpoint: Path, written_by: str, backend: str, world_size: int, record: dict | None = None
) -> None:
    """Refuse a checkpoint this run's backend would load only in part (the Trainer reads another backend's
    optimizer state silently as none), or, for DeepSpeed's ZeRO shards, in another number of processes."""
    names = {"plain": "one process or DDP", "deepspeed": "DeepSpeed", "fsdp": "FSDP"}
    if written_by != backend:
        raise ValueError(
            f"--resume: {checkpoint} was written by {names[written_by]} and this run trains with {names[backend]}; "
            "resume it with the launcher and config that wrote it"
        )
    if backend != "deepspeed":
        return
    shards, stage = deepspeed_layout(checkpoint, record)
    if stage >= 1 and shards != world_size:
        raise ValueError(
            f"--resume: {checkpoint} holds DeepSpeed ZeRO-{stage} state in {shards} shards, one per process, and "
            f"DeepSpeed reads them rank by rank; resume it in {shards} processes, not {world_size}"
        )


def start(folder: str | Path, record: dict, overwrite: bool) -> None:
    """Clear the folder for --overwrite (saying what goes), then write the record (main process only)."""
    folder = Path(folder)
    if overwrite:
        _delete(folder, contents(folder)[0], overwrite_deletes(folder))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD).write_text(json.dumps(record, indent=2))


def _delete(folder: Path, names: list[str], said: str) -> None:
    """Delete `names` in `folder` for --overwrite, saying what goes (`said`) first."""
    if names:
        log.warning("--overwrite: deleting %s in %s", said, folder)
    for name in names:
        path = folder / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def claim(folder: str | Path, overwrite: bool, flag: str) -> None:
    """Clear the folder another command writes a model into (`flag` names it: an export's --out). A folder holding a
    model is refused unless --overwrite, which deletes exactly the files it names; files no model folder holds refuse
    it even then."""
    folder = Path(folder)
    ours, others = contents(folder)
    if others:
        raise FileExistsError(
            f"{flag} {folder} holds {', '.join(others)}, which no model folder holds; choose a new or empty {flag}"
        )
    if ours and not overwrite:
        raise FileExistsError(
            f"{flag} {folder} holds {', '.join(ours)}; choose another {flag}, or --overwrite, which deletes them"
        )
    _delete(folder, ours, ", ".join(ours))


def claim_results(
    folder: Path, command: str, known: re.Pattern, mine: re.Pattern, differs: str | None, overwrite: bool
) -> None:
    """Check the --out folder a results command (`command`: "biprm search", "biprm eval bon") writes into, before
    anything loads. A name `known` does not match is a file no such command writes: refused, even with --overwrite,
    which never deletes it. The names `mine` matches (this command's results and the record of the settings that
    wrote them) are the same command's to go on from when `differs` is None (a rerun resumes from them, or rewrites
    them the same); otherwise (`differs` says what changed) they are refused unless --overwrite, which deletes exactly
    them, saying so."""
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    foreign = [n for n in names if not known.fullmatch(n)]
    if foreign:
        raise FileExistsError(
            f"--out {folder} holds {', '.join(foreign)}, which {command} never writes; choose a new or empty --out "
            f"(--overwrite deletes only what {command} writes)"
        )
    ours = [n for n in names if mine.fullmatch(n)]
    if differs is None or not ours:
        return
    if not overwrite:
        raise ValueError(
            f"--out {folder} holds {', '.join(ours)}, written by another {command} ({differs}); choose another "
            "--out, or --overwrite, which deletes them"
        )
    _delete(folder, ours, ", ".join(ours))


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
