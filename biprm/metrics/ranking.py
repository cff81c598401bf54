"""Threshold-free separation of two groups by a score."""

from __future__ import annotations

import numpy as np


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting half (the Mann-Whitney form of ROC AUC), in %."""
    pos, neg = np.asarray(positive, dtype=np.float64), np.asarray(negative, dtype=np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    neg = np.sort(neg)
    below = np.searchsorted(neg, pos, side="left")
    equal = np.searchsorted(neg, pos, side="right") - below
    return 100.0 * float((below + 0.5 * equal).sum() / (len(pos) * len(neg)))


def paired_win(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair, 1 where a > b, 0.5 where equal, 0 where below, NaN where either is missing: a paired AUC's terms."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.where(np.isnan(a) | np.isnan(b), np.nan, (a > b) + 0.5 * (a == b))
