"""Flat per-step arrays: where each trajectory's steps start, and the positions of a subset of trajectories.

Every per-step output of biprm (a batch's step offsets, `StepScores`, a search's paths) is one flat array with
these offsets, so metrics, packing and the scorers never loop over items.
"""

from __future__ import annotations

import numpy as np


def offsets_of(lengths) -> np.ndarray:
    """[0, l0, l0 + l1, ...]: where each trajectory's steps start in a flat array, plus the end."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def step_positions(offsets: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Flat positions of all steps of trajectories `index`, in that order (no Python loop)."""
    index = np.asarray(index, dtype=np.int64)
    starts, lengths = offsets[index], offsets[index + 1] - offsets[index]
    first = np.cumsum(lengths) - lengths
    return np.repeat(starts - first, lengths) + np.arange(lengths.sum())
