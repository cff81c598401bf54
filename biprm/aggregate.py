"""Per-step scores -> solution scores.

Step scores of many trajectories live in one flat array with `offsets` (trajectory i
owns values[offsets[i]:offsets[i+1]]), so every operator is one vectorised reduce.
"""
from __future__ import annotations

import numpy as np

AGGREGATIONS = ("min", "mean", "prod", "max", "last")


def aggregate(values: np.ndarray, offsets: np.ndarray, how: str = "min") -> np.ndarray:
    """R(tau) for every trajectory: min (the paper's default), mean, prod, max or last step."""
    values = np.asarray(values, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    if np.any(ends <= starts):
        raise ValueError("every trajectory needs at least one step score")
    if how == "min":
        return np.minimum.reduceat(values, starts)
    if how == "max":
        return np.maximum.reduceat(values, starts)
    if how == "mean":
        return np.add.reduceat(values, starts) / (ends - starts)
    if how == "prod":
        return np.multiply.reduceat(values, starts)
    if how == "last":
        return values[ends - 1]
    raise ValueError(f"unknown aggregation {how!r}; choose one of {AGGREGATIONS}")
