"""The one record every part of biprm speaks: a question and its solution steps.

Readers turn raw rows into `Trajectory` objects; everything downstream (encoding,
training, scoring, evaluation) consumes them and never looks at raw rows again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class DataError(ValueError):
    """Bad input. The message always names where (file, row) and which field."""


@dataclass
class Trajectory:
    """tau = (q, s_1..s_T), with optional per-step labels (1 = step is correct).

    `correct` is a stored verdict on the final answer (Best-of-N pools), `answer`
    the gold final answer of the question. `meta` carries ids and provenance.
    """

    question: str
    steps: list[str]
    labels: list[float] | None = None
    answer: str | None = None
    correct: bool | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def first_error(self) -> int:
        """0-based index of the first step labelled wrong (< 0.5), or -1 (ProcessBench convention)."""
        if self.labels is None:
            raise ValueError("first_error needs step labels")
        return next((t for t, y in enumerate(self.labels) if y < 0.5), -1)


def labels_from_first_error(first_error: int, n_steps: int) -> list[float]:
    """ProcessBench labels: 1 before the first wrong step, 0 from it on; all 1 when first_error is -1."""
    if first_error < 0:
        return [1.0] * n_steps
    return [1.0 if t < first_error else 0.0 for t in range(n_steps)]


def check_label(value: Any, where: str) -> float:
    """Accept bool, 0/1 or a float in [0, 1] (soft Monte-Carlo labels); reject anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and not math.isnan(value) and 0.0 <= value <= 1.0:
        return float(value)
    raise DataError(f"{where}: field 'labels': {value!r} is not a bool, 0/1 or a float in [0, 1]")


def validate(traj: Trajectory, where: str) -> Trajectory:
    """Raise DataError naming `where` and the field if `traj` cannot be used; return it otherwise."""
    if not isinstance(traj.question, str) or not traj.question.strip():
        raise DataError(f"{where}: field 'question' is missing or empty")
    if not isinstance(traj.steps, list) or not traj.steps:
        raise DataError(f"{where}: field 'steps' is an empty step list")
    for t, step in enumerate(traj.steps):
        if not isinstance(step, str) or not step.strip():
            raise DataError(f"{where}: field 'steps' has an empty step at index {t}")
    if traj.labels is not None:
        if len(traj.labels) != len(traj.steps):
            raise DataError(f"{where}: field 'labels' has {len(traj.labels)} labels for {len(traj.steps)} steps")
        traj.labels = [check_label(y, where) for y in traj.labels]
    return traj
