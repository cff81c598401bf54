"""`biprm eval` on several processes (`accelerate launch` or `torchrun`): the scoring is shared, nothing else.

The main process runs the evaluation recipe exactly as it runs alone, and alone reads
and writes files (score cache, grades, reports). Every other process only waits for
scoring jobs. A job is what the score cache lacks: a checkpoint and its trajectories.
The main process sends each process one contiguous block of them, scores the first
block itself, and gathers the blocks back in input order, so the scores, and the cache
file written from them, are the ones a single process would compute (up to float
rounding of differently shaped batches). A process that fails sends its error back,
and the main process raises it; when the recipe ends, for any reason, the others stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch.distributed as dist

from biprm.data.trajectory import Trajectory
from biprm.scoring.process_group import WAIT, process_state
from biprm.scoring.step_scores import StepScores, concat, with_empty_rows
from biprm.scoring.scorer import Scorer

log = logging.getLogger(__name__)
Job = tuple[str, list[Trajectory]] | None  # (checkpoint, block of trajectories); None: stop
_jobs = (
    None  # while run_shared runs: the gloo group that carries jobs and results (never a GPU, so waiting costs nothing)
)


def _score(
    scorer: Callable[[str], Scorer], job: tuple[str, list[Trajectory]], progress: bool
) -> StepScores | Exception | None:
    """One block's scores; None for an empty block. A failure is sent back, so that the main process fails
    with it instead of waiting forever: bad input (ValueError, OSError) as a ValueError, anything else as a
    RuntimeError."""
    ckpt, block = job
    if not block:
        return None
    try:
        return _score_here(scorer(ckpt), block, progress)
    except Exception as error:
        kind = ValueError if isinstance(error, (ValueError, OSError)) else RuntimeError
        return kind(f"{type(error).__name__}: {error}")


def _score_here(scorer: Scorer, trajs: list[Trajectory], progress: bool) -> StepScores:
    """Scores of `trajs`; one that no policy can fit in max_length gets no scored step (the ledger counts it, and
    --on-overlength decides whether the tables go on without it), so one long row never ends a run."""
    encs, unscorable = scorer.encode(trajs, skip_unscorable=True)
    if unscorable:
        log.warning("%d of %d trajectories cannot be scored: %s", len(unscorable), len(trajs), unscorable[0][1])
    return with_empty_rows(scorer.score(encs, progress=progress), [i for i, _ in unscorable], len(trajs))


def _gather(result: StepScores | Exception | None) -> list:
    state = process_state()
    parts = [None] * state.num_processes if state.is_main_process else None
    dist.gather_object(result, parts, dst=0, group=_jobs)
    return parts


def score_shared(
    scorer: Callable[[str], Scorer], ckpt: str, trajs: list[Trajectory], progress: bool = True
) -> StepScores:
    """Every process scores one block of `trajs`; scores come back in input order. Outside `run_shared`
    (a Python caller, one process) this process scores them all. `progress`: the main process shows its batches."""
    world = process_state().num_processes
    if _jobs is None or not trajs:
        return _score_here(scorer(ckpt), trajs, progress)
    bounds = [len(trajs) * r // world for r in range(world + 1)]
    blocks = [trajs[a:b] for a, b in zip(bounds, bounds[1:])]
    log.info(
        "scoring %d trajectories with %s on %d processes (%s rows each)",
        len(trajs),
        ckpt,
        world,
        "/".join(str(len(b)) for b in blocks),
    )
    job: list[Job] = [None]
    dist.scatter_object_list(job, [(ckpt, b) for b in blocks], src=0, group=_jobs)
    parts = _gather(_score(scorer, job[0], progress))
    for r, error in enumerate(parts):
        if isinstance(error, Exception):
            raise type(error)(
                f"scoring {ckpt} failed on process {r + 1} of {world}, which scored rows "
                f"{bounds[r] + 1}-{bounds[r + 1]} "
                f"(its 'trajectory k' is row {bounds[r] + 1} + k): {error}"
            )
    return concat([p for p in parts if p is not None])


def serve_scoring(scorer: Callable[[str], Scorer]) -> None:
    """Called by every process but the main one: score the blocks it sends until it says stop."""
    while True:
        job: list[Job] = [None]
        dist.scatter_object_list(job, None, src=0, group=_jobs)
        if job[0] is None:
            return
        _gather(_score(scorer, job[0], progress=False))


def run_shared(recipe: Callable[[], object], scorer: Callable[[str], Scorer]) -> object:
    """Run `recipe` on the main process with the others serving its scoring; alone, just run it."""
    global _jobs
    state = process_state()
    if state.num_processes == 1:
        return recipe()
    _jobs = dist.new_group(backend="gloo", timeout=WAIT)  # every process creates it, at the same point
    try:
        if not state.is_main_process:
            return serve_scoring(scorer)
        try:
            return recipe()
        finally:
            dist.scatter_object_list([None], [None] * state.num_processes, src=0, group=_jobs)
    finally:
        _jobs = None
