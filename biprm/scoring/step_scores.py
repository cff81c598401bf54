"""Per-step outputs of a scored dataset, kept flat so metrics never loop over items.

Trajectory i owns positions offsets[i]:offsets[i+1] of every array, in forward step
order (the R2L stream is already re-aligned). `fused`, `l2r` and `r2l` hold float64
logits, as the model outputs them; `prob()` gives probabilities. `sigma` is the gate
weight on the L2R stream. A stream the model does not run is None. `score_rows` turns
them into the JSON lines that `biprm score` writes and the server returns; `save_scores`
and `load_scores` keep them in npz files (the score cache's, a study's per-run logits).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from biprm.data.encoding import Encoded
from biprm.data.trajectory import Trajectory
from biprm.data.writer import atomic_write
from biprm.offsets import offsets_of, step_positions
from biprm.scoring.aggregate import AGGREGATIONS, aggregate, logit, sigmoid

OPTIONAL_OUTPUTS = ("l2r", "r2l", "sigma")  # in StepScores' field order; None where the model lacks them
STEP_OUTPUTS = (*OPTIONAL_OUTPUTS, "fused")  # every per-step array, as score rows name them
FIELDS = ("offsets", "fused", *OPTIONAL_OUTPUTS)  # what an npz file keeps of a StepScores


@dataclass
class StepScores:
    offsets: np.ndarray
    fused: np.ndarray
    l2r: np.ndarray | None = None
    r2l: np.ndarray | None = None
    sigma: np.ndarray | None = None

    @classmethod
    def from_probs(cls, offsets, fused, l2r=None, r2l=None, sigma=None) -> "StepScores":
        """Scores given as step probabilities (another PRM's output, a hand-made example)."""
        as_logit = lambda p: None if p is None else logit(p)  # noqa: E731
        return cls(
            np.asarray(offsets, dtype=np.int64),
            logit(fused),
            as_logit(l2r),
            as_logit(r2l),
            None if sigma is None else np.asarray(sigma),
        )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def prob(self, stream: str = "fused") -> np.ndarray:
        """Step probabilities of one stream, flat."""
        return sigmoid(getattr(self, stream))

    def of(self, i: int, stream: str = "fused") -> np.ndarray:
        """The step probabilities of trajectory i in one stream (sigma as is)."""
        values = getattr(self, stream)[self.offsets[i] : self.offsets[i + 1]]
        return values if stream == "sigma" else sigmoid(values)

    def solution_logits(self, how: str = "min", stream: str = "fused") -> np.ndarray:
        """One logit per trajectory: what ranks candidates (see biprm.scoring.aggregate)."""
        return aggregate(getattr(self, stream), self.offsets, how)

    def solution_scores(self, how: str = "min", stream: str = "fused") -> np.ndarray:
        """One probability per trajectory, as the aggregation defines it on step probabilities."""
        return sigmoid(self.solution_logits(how, stream))

    def select(self, index: np.ndarray) -> "StepScores":
        """The scores of a subset of trajectories, in the order of `index`."""
        index = np.asarray(index, dtype=np.int64)
        lengths = np.diff(self.offsets)[index]
        flat = step_positions(self.offsets, index)
        pick = lambda a: None if a is None else a[flat]  # noqa: E731
        return StepScores(offsets_of(lengths), self.fused[flat], pick(self.l2r), pick(self.r2l), pick(self.sigma))


def concat(parts: list[StepScores]) -> StepScores:
    """The scores of several blocks of trajectories, one after another."""
    join = lambda k: None if getattr(parts[0], k) is None else np.concatenate([getattr(p, k) for p in parts])  # noqa: E731
    return StepScores(
        offsets_of(np.concatenate([np.diff(p.offsets) for p in parts])),
        join("fused"),
        join("l2r"),
        join("r2l"),
        join("sigma"),
    )


def with_empty_rows(scores: StepScores, missing: list[int], n: int) -> StepScores:
    """`n` trajectories' scores from those of all but `missing`: each missing one holds no scored step, which is how
    a trajectory no policy could score travels (and is cached) beside the others."""
    lengths = np.zeros(n, dtype=np.int64)
    lengths[np.setdiff1d(np.arange(n), missing)] = np.diff(scores.offsets)
    return StepScores(offsets_of(lengths), scores.fused, scores.l2r, scores.r2l, scores.sigma)


def score_rows(
    trajs: list[Trajectory], scores: StepScores, digits: int | None = 6, encs: list[Encoded] | None = None
) -> Iterator[dict]:
    """One dict per trajectory, the same keys whatever the mode: a stream the model lacks is null.

    The input travels with its scores (question, steps, labels, answer, correct, meta with
    any extra input fields), so the output joins back by content, not by line order.
    `steps_scored` < len(steps) when steps past max_length were not scored; given the encodings (`encs`), each row
    also says what its length cost: `n_dropped` steps, the index of the first scored step `first_scored` (> 0 where
    leading steps were dropped), and whether it was `windowed`. Step scores
    are probabilities rounded to `digits` (None: kept whole); `solution` holds each
    aggregation's probability and `solution_logit` its logit, which ranks candidates whose
    probabilities round to the same float (Best-of-N from this file should sort by it).
    """
    logits = {how: scores.solution_logits(how) for how in AGGREGATIONS}
    solution = {how: sigmoid(x) for how, x in logits.items()}
    step = float if digits is None else lambda x: round(float(x), digits)
    for i, traj in enumerate(trajs):
        row = {
            "question": traj.question,
            "steps": traj.steps,
            "labels": traj.labels,
            "answer": traj.answer,
            "correct": traj.correct,
            "meta": traj.meta,
        }
        row |= {s: None if getattr(scores, s) is None else [step(x) for x in scores.of(i, s)] for s in STEP_OUTPUTS}
        row["solution"] = {how: float(solution[how][i]) for how in AGGREGATIONS}
        row["solution_logit"] = {how: float(logits[how][i]) for how in AGGREGATIONS}
        row["steps_scored"] = int(scores.offsets[i + 1] - scores.offsets[i])
        if encs is not None:
            row |= {"n_dropped": encs[i].n_dropped, "first_scored": encs[i].first, "windowed": encs[i].windowed}
        yield row


def save_scores(path: str | Path, scores: dict[str, StepScores], compress: bool = False) -> Path:
    """Named StepScores in one npz file, written whole or not at all. Keys are `name/field`, with the
    name "" a bare `field` (the score cache keeps one set per file); a stream the model lacks is left out."""
    arrays = {
        f"{name}/{field}" if name else field: value
        for name, s in scores.items()
        for field in FIELDS
        if (value := getattr(s, field)) is not None
    }
    return atomic_write(path, lambda f: (np.savez_compressed if compress else np.savez)(f, **arrays))


def load_scores(path: str | Path) -> dict[str, StepScores]:
    """What `save_scores` wrote, by name."""
    fields: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            name, _, field = key.rpartition("/")
            fields.setdefault(name, {})[field] = data[key]
    return {name: StepScores(**arrays) for name, arrays in fields.items()}
