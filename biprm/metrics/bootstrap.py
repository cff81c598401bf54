"""Intervals over questions (and seeds): how far a mean or a difference of two scorers could move.

Values come per question, one row per seed ([Q] or [S, Q]). A resample draws questions
with replacement, and seeds with replacement too, so an interval covers both sources of
noise. A difference of two scorers resamples the same questions for both (a paired
bootstrap): question difficulty cancels, and only the scorers' disagreement remains.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def percentile_interval(values: np.ndarray, level: float = 0.95, axis: int | None = None) -> np.ndarray:
    """[low, high] percentile bounds of resampled values (along `axis`), NaN draws left out; NaN, with numpy's
    RuntimeWarning, where every draw is NaN (a statistic no resample could measure)."""
    return np.nanquantile(values, [(1 - level) / 2, (1 + level) / 2], axis=axis)


def question_clusters(questions: Sequence[str]) -> np.ndarray:
    """An id per item, shared by items whose question text is the same once case and spacing are normalised: rows of
    one question are not independent draws, so a bootstrap over questions draws them together."""
    return np.unique([" ".join(q.lower().split()) for q in questions], return_inverse=True)[1]


def cluster_weights(clusters: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[B, Q]: how often each item enters each resample when as many clusters as there are, each with all its items,
    are drawn with replacement (draw b takes clusters `rng.integers(C, size=(B, C))[b]`, ids in sorted order)."""
    index = np.unique(clusters, return_inverse=True)[1]
    c = int(index.max()) + 1
    drawn = rng.integers(c, size=(resamples, c)) + c * np.arange(resamples)[:, None]
    return np.bincount(drawn.ravel(), minlength=resamples * c).reshape(resamples, c)[:, index]


def _resampled_means(
    values: np.ndarray, questions: np.ndarray, rng: np.random.Generator, weighted: bool = False
) -> np.ndarray:
    """[B] means of `values` ([S, Q]) over resampled questions (the [B, Q] index, or with `weighted` the [B, Q] counts
    of `cluster_weights`) and resampled seeds."""
    if weighted:
        per_seed = values @ questions.T / questions.sum(1)  # [S, B]
    else:
        per_seed = values[:, questions].mean(-1)
    seeds = rng.integers(len(values), size=(questions.shape[0], len(values)))  # [B, S]
    return per_seed[seeds, np.arange(questions.shape[0])[:, None]].mean(-1)


def _draws(n: int, clusters: np.ndarray | None, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Resampled questions: a [B, Q] index, or [B, Q] cluster weights where `clusters` groups them."""
    if clusters is None:
        return rng.integers(n, size=(resamples, n))
    if len(clusters) != n:
        raise ValueError(f"clusters needs one id per question: {len(clusters)} against {n}")
    return cluster_weights(np.asarray(clusters), resamples, rng)


def _as_rows(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    v = v[None] if v.ndim == 1 else v
    if v.ndim != 2 or v.shape[1] == 0:
        raise ValueError("values must be [questions] or [seeds, questions], with at least one question")
    return v


def bootstrap_mean(
    values: np.ndarray, resamples: int = 2000, seed: int = 0, level: float = 0.95, clusters: np.ndarray | None = None
) -> dict:
    """{"mean", "low", "high"}: the mean over seeds and questions, and its percentile interval; with `clusters`
    (`question_clusters`), items of one cluster are drawn together."""
    v = _as_rows(values)
    rng = np.random.default_rng(seed)
    means = _resampled_means(v, _draws(v.shape[1], clusters, resamples, rng), rng, clusters is not None)
    low, high = percentile_interval(means, level)
    return {"mean": float(v.mean()), "low": float(low), "high": float(high)}


def paired_difference(
    a: np.ndarray,
    b: np.ndarray,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    clusters: np.ndarray | None = None,
) -> dict:
    """{"mean", "low", "high", "within_noise"}: mean(a) - mean(b) on the same questions (the same clusters, with
    `clusters`); within noise when the interval holds 0."""
    a, b = _as_rows(a), _as_rows(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a paired difference needs the same questions: {a.shape[1]} against {b.shape[1]}")
    rng = np.random.default_rng(seed)
    questions, weighted = _draws(a.shape[1], clusters, resamples, rng), clusters is not None
    diffs = _resampled_means(a, questions, rng, weighted) - _resampled_means(b, questions, rng, weighted)
    low, high = percentile_interval(diffs, level)
    return {
        "mean": float(a.mean() - b.mean()),
        "low": float(low),
        "high": float(high),
        "within_noise": bool(low <= 0 <= high),
    }


def bootstrap_statistic(
    stat: Callable[[np.ndarray], float], n: int, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> dict:
    """{"mean", "low", "high"} of a statistic that is not a mean of per-item values (F1, AUC):
    `stat(index)` is evaluated on the full index and on `resamples` resampled ones."""
    rng = np.random.default_rng(seed)
    values = np.array([stat(rng.integers(n, size=n)) for _ in range(resamples)])
    low, high = percentile_interval(values, level)
    return {"mean": float(stat(np.arange(n))), "low": float(low), "high": float(high)}
