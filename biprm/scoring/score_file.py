"""`biprm score`: a data file -> scored JSONL, written as it goes, resumable, on one or many processes.

Each process (one per device under `accelerate launch` or `torchrun`) takes one
contiguous block of the rows (so a question's candidates stay together for the prompt
cache), scores it in chunks and appends every chunk's lines to its own part file,
flushed to disk. A killed run loses at most the chunk in flight: `--resume` keeps the
complete lines of each part file and scores only the rest. When every process is done,
the first one joins the parts in input order into the output, through a rename, so the
output file is never seen half-written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from biprm.folder import ModelFolder, recorded, resolve
from biprm.config import ScorerSettings
from biprm.backbones import load_tokenizer
from biprm.data.readers import load_trajectories, skip_report
from biprm.data.segment import Segmenter, for_model
from biprm.data.trajectory import DataError, Trajectory
from biprm.data.writer import atomic_write
from biprm.run_folder import changes
from biprm.scoring.process_group import process_state
from biprm.scoring.scorer import Scorer
from biprm.scoring.step_scores import score_rows

log = logging.getLogger(__name__)


def complete_lines(path: Path) -> int:
    """Lines of `path` that end in a newline and parse as JSON; a torn tail is cut off the file."""
    if not path.exists():
        return 0
    good, keep = 0, 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                json.loads(line)
            except ValueError:
                break
            good, keep = good + 1, keep + len(line)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return good


def chunks(done: int, total: int, size: int, desc: str, show: bool = True) -> Iterator[tuple[int, int]]:
    """(start, end) of each chunk of `size` rows from row `done` to `total`: what a resumable scoring computes and
    keeps at a time. Its progress bar counts rows and starts at `done`, so a resumed run shows where it stands."""
    with tqdm(total=total, initial=done, desc=desc, unit="row", disable=not show) as bar:
        for a in range(done, total, size):
            yield a, min(a + size, total)
            bar.update(min(size, total - a))


def score_file(
    model: str,
    source: str,
    output: str,
    fmt: str = "auto",
    skip_invalid: bool = False,
    settings: ScorerSettings | None = None,
    chunk: int = 1024,
    resume: bool = False,
    overwrite: bool = False,
    segmenter: str | None = None,
) -> dict:
    """Score `source` into `output`; `segmenter` cuts a one-string trace (default: the model's, see
    `trace_segmenter`). Returns the counts `summary` words: rows read, skipped, cut and the steps dropped."""
    settings = settings or ScorerSettings()
    check_output(output, resume, overwrite)
    folder = resolve(model, settings.prm_kind, settings.prm_mode, settings.prm_reference)
    split = trace_segmenter([folder], segmenter)
    trajs = load_trajectories(
        source, fmt=fmt, skip_invalid=skip_invalid, split_rule=split
    )  # bad rows fail before the model loads
    state = process_state()
    rank, world = state.process_index, state.num_processes
    to_stdout = output == "-"
    if to_stdout and world > 1:
        raise ValueError("--output - works with one process; give a file to score with several")
    scratch = Path(output + ".parts") if not to_stdout else None
    if (
        scratch is not None and state.is_main_process
    ):  # what decides which rows each part holds, and how they are scored
        run = {
            "model": str(Path(model).resolve()),
            "model_files": _stamp(Path(model)),
            "input": source,
            "input_file": _stamp(Path(source)),
            "rows": len(trajs),
            "processes": world,
            "format": fmt,
            "skip_invalid": skip_invalid,
            "max_length": settings.max_length,
            "overlength": settings.overlength,
            "segmenter": split.name,
        }
        # how a PRM trained elsewhere is read, where a flag says so (a record written without them still resumes)
        foreign = {
            "prm_kind": settings.prm_kind,
            "prm_mode": settings.prm_mode,
            "prm_reference": settings.prm_reference,
        }
        run |= {k: v for k, v in foreign.items() if v is not None}
        _check_run(scratch, run, resume)
    state.wait_for_everyone()

    begin, end = len(trajs) * rank // world, len(trajs) * (rank + 1) // world
    log.info("process %d of %d scores rows %d-%d", rank + 1, world, begin + 1, end)
    try:
        scorer = Scorer.from_settings(folder, settings, settings.device or state.device)
    except BaseException:
        if scratch is not None and state.is_main_process and not any(p.stat().st_size for p in scratch.glob("part-*")):
            shutil.rmtree(scratch, ignore_errors=True)  # a model that did not load leaves no folder to trip over
        raise
    mine, names = trajs[begin:end], [where_from(source, k, trajs[k]) for k in range(begin, end)]
    encs, problems = scorer.encode(mine, names, skip_invalid=True)  # step-tag text, a first step past max_length
    first = _from_every_process([error for _, error in problems[:1]], world)
    if first and not skip_invalid:
        raise DataError(first[0])  # in every process, so that none waits for a block that will never come
    if problems:  # each process reports its own block
        log.warning(skip_report(source, [(begin + i + 1, error) for i, error in problems], len(mine), "trajectory"))
        bad = {i for i, _ in problems}
        mine = [t for i, t in enumerate(mine) if i not in bad]
    part = None if to_stdout else scratch / f"part-{rank:05d}-of-{world:05d}.jsonl"
    done = 0
    if part is not None:
        done = complete_lines(part)
        if done > len(mine):
            raise ValueError(
                f"--resume: {part} holds {done} rows, more than the {len(mine)} this process scores; delete {scratch}"
            )
        if done:
            log.info("resuming: %d of %d rows of part %d already scored", done, len(mine), rank)
    sink = sys.stdout if to_stdout else open(part, "a")
    try:
        for a, b in chunks(done, len(mine), chunk, f"scoring ({scorer.mode})", show=state.is_main_process):
            scores = scorer.score(encs[a:b], progress=False)
            sink.writelines(json.dumps(row) + "\n" for row in score_rows(mine[a:b], scores, encs=encs[a:b]))
            sink.flush()
            if not to_stdout:
                os.fsync(sink.fileno())
    finally:
        if not to_stdout:
            sink.close()
    state.wait_for_everyone()
    if state.is_main_process and not to_stdout:
        _join(sorted(scratch.glob(f"part-*-of-{world:05d}.jsonl")), Path(output), world)
        for p in scratch.glob("part-*"):
            p.unlink()
        (scratch / "run.json").unlink()  # last: parts never outlive the record that says whose they are
        scratch.rmdir()
    cut = [e for e in encs if e.n_dropped]
    counts = np.array(_from_every_process([(len(problems), len(cut), sum(e.n_dropped for e in cut))], world)).sum(0)
    return dict(zip(("read", "skipped", "cut", "steps_dropped"), [len(trajs), *map(int, counts)]))


def summary(counts: dict, output: str, max_length: int) -> str:
    """The closing line of `biprm score`: what it read and wrote, and what --max-length cut, the counts the ledger of
    `biprm eval` gives."""
    where = "stdout" if output == "-" else output
    line = f"scored {counts['read'] - counts['skipped']} of {counts['read']} rows read into {where}"
    line += f"; {counts['skipped']} skipped (each named above)" if counts["skipped"] else ""
    cut = f"; {counts['cut']} cut at --max-length={max_length}, {counts['steps_dropped']} steps dropped (unscored)"
    return line + (cut if counts["cut"] else "")


def check_output(output: str, resume: bool, overwrite: bool) -> None:
    """Refuse, before anything loads, an --output file that exists, unless --overwrite (it is replaced, whole, once the
    new scores are complete) or --resume with the parts of the run that was let write there."""
    parts = Path(output + ".parts")
    if output == "-" or overwrite or not Path(output).exists() or (resume and parts.is_dir()):
        return
    raise FileExistsError(
        f"--output {output} exists; choose another --output, or --overwrite, which replaces it once the new scores are "
        "complete"
    )


def where_from(source: str, k: int, traj: Trajectory) -> str:
    """How a message names trajectory k of `source`: a Best-of-N candidate by its row and its index in the row's list
    (counted from 0, as the readers' `candidates[j]`); any other by its place in the file (one trajectory per row, but
    two per PRMBench row)."""
    if "qid" in traj.meta and "cand" in traj.meta:
        return f"{source} row {traj.meta['qid'] + 1} candidate {traj.meta['cand']}"
    return f"{source} trajectory {k + 1}"


def trace_segmenter(models: list[str | ModelFolder], chosen: str | None, tokenizer=None) -> Segmenter:
    """What cuts a trace given as one string (and a Best-of-N candidate's text) for score, eval and serve: `chosen`,
    else the segmenter the models' configs record (biprm.data.segment.for_model; models that disagree must be told
    which); tokens:N counts the first model's tokens (or `tokenizer`'s)."""
    trained = sorted({m.segmenter if isinstance(m, ModelFolder) else recorded(m, "segmenter", "given") for m in models})
    trained = trained or ["given"]
    if chosen is None and len(trained) > 1:
        raise ValueError(
            f"the models were trained with different segmenters ({', '.join(trained)}): name one with --segmenter"
        )
    name = chosen or trained[0]
    if name.startswith("tokens:") and tokenizer is None and models:
        tokenizer = models[0].tokenizer if isinstance(models[0], ModelFolder) else load_tokenizer(models[0])
    return for_model(chosen, trained[0], tokenizer)


def _from_every_process(items: list, world: int) -> list:
    """Every process's items, on every process."""
    if world == 1:
        return items
    from accelerate.utils import gather_object

    return gather_object(items)


def _stamp(path: Path) -> list:
    """Size and modification time of a file, or of a folder's files: an edited input or a retrained model differs."""
    if not path.exists():
        return []
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _check_run(scratch: Path, run: dict, resume: bool) -> None:
    """Record what this run scores; a resume must be the same run (model, input, rows, processes, and the settings that
    decide which rows are skipped: format, skip_invalid, max_length)."""
    record = scratch / "run.json"
    if scratch.exists() and not any(p.stat().st_size for p in scratch.glob("part-*")):
        shutil.rmtree(scratch)  # a run that failed before its first chunk: nothing to keep, nothing to block a retry
    if scratch.exists() and not resume:
        raise FileExistsError(
            f"{scratch} holds the parts of an unfinished run: add --resume to continue it, or delete it"
        )
    if resume and scratch.exists() and not record.exists() and any(scratch.iterdir()):
        raise FileExistsError(
            f"{scratch} holds parts but no run.json saying which run wrote them; delete the folder and start again"
        )
    if resume and record.exists():
        before = json.loads(record.read_text())
        if before != run:
            raise ValueError(f"--resume: {scratch} belongs to another run ({', '.join(changes(before, run))})")
    scratch.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(run))


def _join(parts: list[Path], target: Path, world: int) -> None:
    if len(parts) != world:
        raise RuntimeError(f"expected {world} part files, found {len(parts)}: a process did not finish")
    atomic_write(target, lambda out: out.writelines(p.read_bytes() for p in parts))
