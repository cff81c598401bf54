"""Per-step outputs of a scored dataset, kept flat so metrics never loop over items.

Trajectory i owns positions offsets[i]:offsets[i+1] of every array, in forward step
order (the R2L stream is already re-aligned). Arrays hold probabilities, except
`sigma`, the gate weight on the L2R stream. A stream the model does not run is None.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from biprm.aggregate import aggregate


@dataclass
class StepScores:
    offsets: np.ndarray
    fused: np.ndarray
    l2r: np.ndarray | None = None
    r2l: np.ndarray | None = None
    sigma: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, i: int, stream: str = "fused") -> np.ndarray:
        """The step scores of trajectory i in one stream."""
        return getattr(self, stream)[self.offsets[i] : self.offsets[i + 1]]

    def solution_scores(self, how: str = "min", stream: str = "fused") -> np.ndarray:
        return aggregate(getattr(self, stream), self.offsets, how)

    def select(self, index: np.ndarray) -> "StepScores":
        """The scores of a subset of trajectories, in the order of `index`."""
        index = np.asarray(index, dtype=np.int64)
        lengths = np.diff(self.offsets)[index]
        flat = step_positions(self.offsets, index)
        pick = lambda a: None if a is None else a[flat]  # noqa: E731
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return StepScores(offsets, self.fused[flat], pick(self.l2r), pick(self.r2l), pick(self.sigma))


def step_positions(offsets: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Flat positions of all steps of trajectories `index`, in that order (no Python loop)."""
    index = np.asarray(index, dtype=np.int64)
    starts, lengths = offsets[index], offsets[index + 1] - offsets[index]
    first = np.cumsum(lengths) - lengths
    return np.repeat(starts - first, lengths) + np.arange(lengths.sum())
