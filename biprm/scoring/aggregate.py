"""Per-step logits -> solution scores, kept as logits so that no two solutions tie by rounding.

Step scores of many trajectories live in one flat array with `offsets` (trajectory i
owns values[offsets[i]:offsets[i+1]]), so every operator is one vectorised reduce.
Each aggregation is the paper's operator on step probabilities p_t = sigmoid(x_t),
returned as the logit of its result:

    min, max, last   the same step in logit space (sigmoid is monotone)
    prod             log P = sum_t log sigmoid(x_t),   logit P = log P - log(1 - P)
    mean             logit(mean_t p_t) = logsumexp_t log sigmoid(x_t) - logsumexp_t log sigmoid(-x_t)

In probability space a step logit of 12 and one of 12.0001 both round to 0.99999 in
float32, and the product of many probabilities near 1 rounds to 1; in logit space every
ordering the model makes survives, so Best-of-N never picks by pool order.
"""

from __future__ import annotations

import numpy as np

AGGREGATIONS = ("min", "mean", "prod", "max", "last")


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log sigmoid(x) = -log(1 + e^-x), exact for large |x| of either sign."""
    return -np.logaddexp(0.0, -np.asarray(x, dtype=np.float64))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """sigmoid(x) in float64 without overflow: exp(log sigmoid(x))."""
    return np.exp(log_sigmoid(x))


def logit(p: np.ndarray) -> np.ndarray:
    """The inverse of `sigmoid`; 0 and 1 map to -inf and +inf."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.log(p) - np.log1p(-p)


def logit_of_log(log_p: np.ndarray) -> np.ndarray:
    """logit(P) from log P <= 0, precise when P is near 1 (log(1 - P) = log(-expm1(log P)))."""
    with np.errstate(divide="ignore"):
        return log_p - np.log(-np.expm1(log_p))


def segments(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values in float64, where each trajectory starts, its length) of flat per-step `values`: what every
    reduce over trajectories needs. Offsets that do not run from 0 to len(values), or an empty trajectory, are
    refused."""
    values = np.asarray(values, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != len(values):
        raise ValueError(f"offsets must run from 0 to len(values)={len(values)}")
    lengths = np.diff(offsets)
    if np.any(lengths <= 0):
        raise ValueError("every trajectory needs at least one step score")
    return values, offsets[:-1], lengths


def aggregate(logits: np.ndarray, offsets: np.ndarray, how: str = "min") -> np.ndarray:
    """The logit of R(tau) for every trajectory: min (the paper's default), mean, prod, max or last step."""
    x, starts, lengths = segments(logits, offsets)
    if how == "min":
        return np.minimum.reduceat(x, starts)
    if how == "max":
        return np.maximum.reduceat(x, starts)
    if how == "last":
        return x[starts + lengths - 1]
    if how == "prod":
        return logit_of_log(np.add.reduceat(log_sigmoid(x), starts))
    if how == "mean":
        return np.logaddexp.reduceat(log_sigmoid(x), starts) - np.logaddexp.reduceat(log_sigmoid(-x), starts)
    raise ValueError(f"unknown aggregation {how!r}; choose one of {AGGREGATIONS}")


def mean_of_probabilities(logits: list[np.ndarray]) -> np.ndarray:
    """The logit of the mean probability of several models, step by step (the paper's 2x ensembles):
    each step is a "trajectory" whose steps are the models, aggregated by mean."""
    x = np.stack([np.asarray(a, dtype=np.float64) for a in logits], axis=1)
    return aggregate(x.ravel(), np.arange(0, x.size + 1, x.shape[1]), "mean")
