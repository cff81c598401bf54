"""Pieces every analysis shares: labels as flat arrays, the ProcessBench report of one mode, Markdown tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from biprm.data.trajectory import Trajectory
from biprm.metrics.first_error import first_error_f1_by_subset, predict_first_error
from biprm.scoring.step_scores import StepScores

TITLES = {
    "gsm8k": "GSM8K",
    "math": "MATH",
    "olympiadbench": "OlympiadBench",
    "omnimath": "Omni-MATH",
}  # subset -> table heading


def first_errors(trajs: Sequence[Trajectory]) -> np.ndarray:
    """0-based first wrong step per trajectory, -1 when none."""
    return np.array([t.first_error for t in trajs], dtype=np.int64)


def scored_part(flat: np.ndarray, n_steps: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The entries of per-step `flat` (n_steps per trajectory) for the steps that were scored.

    The scorer may cut trailing steps past max_length, so `offsets` can hold fewer steps
    per trajectory than the data; the first `diff(offsets)` of each are kept.
    """
    scored = np.diff(offsets)
    if len(scored) != len(n_steps) or np.any(scored > n_steps):
        raise ValueError("scores do not belong to these trajectories (count or step numbers differ)")
    starts = np.cumsum(n_steps) - n_steps
    return flat[np.repeat(starts - offsets[:-1], scored) + np.arange(offsets[-1])]


def step_labels(trajs: Sequence[Trajectory], offsets: np.ndarray) -> np.ndarray:
    """Labels of the scored steps, flat like `offsets`."""
    if any(t.labels is None for t in trajs):
        raise ValueError("step labels are needed on every trajectory")
    n_steps = np.array([len(t.labels) for t in trajs])
    labels = np.fromiter(chain.from_iterable(t.labels for t in trajs), dtype=np.float64, count=n_steps.sum())
    return scored_part(labels, n_steps, offsets)


def judged_rows(trajs: Sequence[Trajectory], scores: StepScores) -> tuple[StepScores, np.ndarray]:
    """(scores, first errors) of the rows whose first error lies in the scored steps.

    A row whose first error sits in steps cut at max_length cannot be judged, so it is
    left out of threshold tuning and validation rather than counted as a miss.
    """
    first = first_errors(trajs)
    seen = first < np.diff(scores.offsets)
    return scores.select(np.flatnonzero(seen)), first[seen]


def subsets(trajs: Sequence[Trajectory]) -> np.ndarray:
    """ProcessBench subset of every trajectory (meta "subset"), "all" where none is given."""
    return np.array([str(t.meta.get("subset", "all")) for t in trajs])


def threshold_of(threshold: float | Mapping[str, float], mode: str) -> float:
    """One threshold for all modes, or one per mode (e.g. each tuned on GSM8K)."""
    return float(threshold[mode]) if isinstance(threshold, Mapping) else float(threshold)


def first_error_report(trajs: Sequence[Trajectory], scores: StepScores, threshold: float) -> dict:
    """ProcessBench protocol on the fused probabilities: per-subset scores and the mean F1 over subsets."""
    if len(scores) != len(trajs):
        raise ValueError(f"{len(scores)} scored trajectories for {len(trajs)} trajectories")
    pred = predict_first_error(scores.prob(), scores.offsets, threshold)
    return first_error_f1_by_subset(pred, first_errors(trajs), subsets(trajs))


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A pipe table; the first `left` columns are text (left-aligned), the rest numbers (right-aligned)."""
    rule = ["---" if i < left else "---:" for i in range(len(head))]
    return "\n".join("| " + " | ".join(row) + " |" for row in [list(head), rule, *rows])
