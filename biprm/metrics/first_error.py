"""ProcessBench first-error detection: predict the first wrong step, score it, tune the threshold.

Labels and predictions are 0-based step indices, -1 meaning "no wrong step". Step
probabilities are flat with `offsets` (see biprm.scoring.step_scores), so predictions and the whole
threshold sweep are vectorised reduces, never a loop over trajectories.
"""

from __future__ import annotations

import warnings

import numpy as np

from biprm.metrics.bootstrap import cluster_weights, percentile_interval
from biprm.scoring.aggregate import segments

_NONE = np.iinfo(np.int64).max


def predict_first_error(probs: np.ndarray, offsets: np.ndarray, threshold: float) -> np.ndarray:
    """Per trajectory, the first step with probability < threshold, else -1."""
    probs, starts, lengths = segments(probs, offsets)
    local = np.arange(len(probs)) - np.repeat(starts, lengths)
    first = np.minimum.reduceat(np.where(probs < threshold, local, _NONE), starts)
    return np.where(first == _NONE, -1, first)


def _f1(acc_error: np.ndarray, acc_correct: np.ndarray) -> np.ndarray:
    """Harmonic mean; 0 where both accuracies are 0 rather than 0/0."""
    total = acc_error + acc_correct
    return np.divide(2 * acc_error * acc_correct, total, out=np.zeros_like(total, dtype=np.float64), where=total > 0)


def processbench_scores(pred: np.ndarray, label: np.ndarray) -> dict:
    """acc_error (exact index on erroneous rows), acc_correct (-1 on clean rows), F1, all in %.

    An accuracy over zero rows is NaN (and so is F1): there is nothing to measure.
    """
    pred, label = np.asarray(pred), np.asarray(label)
    err = label != -1
    n_error, n_correct = int(err.sum()), int((~err).sum())
    acc_error = 100.0 * float(np.mean(pred[err] == label[err])) if n_error else float("nan")
    acc_correct = 100.0 * float(np.mean(pred[~err] == -1)) if n_correct else float("nan")
    f1 = float(_f1(np.float64(acc_error), np.float64(acc_correct))) if n_error and n_correct else float("nan")
    return {"acc_error": acc_error, "acc_correct": acc_correct, "f1": f1, "n_error": n_error, "n_correct": n_correct}


def default_grid(probs: np.ndarray) -> np.ndarray:
    """Every distinct outcome once: the lowest value and the midpoints between consecutive
    distinct values of probs ∪ {0, 1}. F1 is constant between consecutive values, so this
    finds the exact optimum for any threshold in (-inf, 1], with no resolution to choose."""
    v = np.unique(np.concatenate([[0.0, 1.0], np.asarray(probs, dtype=np.float64)]))
    return np.concatenate([v[:1], (v[:-1] + v[1:]) / 2])


def f1_over_grid(probs: np.ndarray, offsets: np.ndarray, label: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """F1 (%) at every threshold of `grid` in O((rows + grid) log rows).

    An erroneous row with first error e is right exactly when p_e < θ <= min(p_0..p_{e-1});
    a clean row when θ <= min(p). Counting rows whose interval holds θ is two searchsorted calls.
    """
    probs, starts, lengths = segments(probs, offsets)
    label = np.asarray(label, dtype=np.int64)
    if len(label) != len(starts) or np.any(label < -1) or np.any(label >= lengths):
        raise ValueError("label needs one entry per trajectory, each -1 or a step index")
    err = label >= 0
    if not err.any() or err.all():
        raise ValueError("tuning needs both erroneous (label >= 0) and clean (label == -1) rows")
    grid = np.asarray(grid, dtype=np.float64)
    s, e = starts[err], label[err]
    low = probs[s + e]
    before = np.minimum.reduceat(probs, np.column_stack([s, s + e]).ravel())[::2]
    high = np.where(e == 0, np.inf, before)
    keep = low < high
    hit_error = np.searchsorted(np.sort(low[keep]), grid) - np.searchsorted(np.sort(high[keep]), grid)
    clean_min = np.sort(np.minimum.reduceat(probs, starts)[~err])
    hit_correct = len(clean_min) - np.searchsorted(clean_min, grid)
    return _f1(100.0 * hit_error / err.sum(), 100.0 * hit_correct / (~err).sum())


def tune_threshold(
    probs: np.ndarray, offsets: np.ndarray, label: np.ndarray, grid: np.ndarray | None = None
) -> tuple[float, float]:
    """(threshold, F1) maximising F1, as ProcessBench's authors do on GSM8K before applying it to all.

    grid defaults to `default_grid(probs)`. F1 plateaus are common, so ties go to the
    threshold closest to 0.5 (the reference code's fixed value), then to the smaller one.
    """
    grid = np.unique(default_grid(probs) if grid is None else np.asarray(grid, dtype=np.float64))
    f1 = f1_over_grid(probs, offsets, label, grid)
    best = grid[f1 >= f1.max() - 1e-9]
    pick = best[np.argmin(np.abs(best - 0.5))]
    return float(pick), float(f1.max())


def first_error_f1_by_subset(
    pred: np.ndarray,
    label: np.ndarray,
    subset: np.ndarray,
    resamples: int = 0,
    seed: int = 0,
    clusters: np.ndarray | None = None,
) -> dict:
    """ProcessBench's report: scores per subset (in order of first appearance) and the mean F1 over subsets. With
    `resamples`, each F1 also gets a 95 % percentile interval ("f1_interval", "average_f1_interval") over the rows of
    each subset resampled by question: `clusters` (`bootstrap.question_clusters`) gives each row its question, and a
    draw takes a question's rows together (without it, each row is its own question)."""
    pred, label, subset = np.asarray(pred), np.asarray(label), np.asarray(subset)
    names, first = np.unique(subset, return_index=True)
    rows = {str(name): np.flatnonzero(subset == name) for name in names[np.argsort(first)]}
    per = {name: processbench_scores(pred[r], label[r]) for name, r in rows.items()}
    report = {"subsets": per, "average_f1": float(np.mean([s["f1"] for s in per.values()]))}
    if resamples:
        rng = np.random.default_rng(seed)
        clusters = np.arange(len(pred)) if clusters is None else np.asarray(clusters)
        # F1 of each subset's questions drawn with replacement, [resamples, subsets]
        draws = np.column_stack([_resampled_f1(pred[r], label[r], clusters[r], resamples, rng) for r in rows.values()])
        with warnings.catch_warnings():  # a subset without both kinds of row has no F1: its interval is NaN, expected
            warnings.simplefilter("ignore", RuntimeWarning)
            per_subset, average = percentile_interval(draws, axis=0).T, percentile_interval(draws.mean(axis=1))
        for name, interval in zip(per, per_subset):
            per[name]["f1_interval"] = interval.tolist()
        report["average_f1_interval"] = average.tolist()
    return report


def _resampled_f1(
    pred: np.ndarray, label: np.ndarray, clusters: np.ndarray, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """[resamples] F1 of the rows with their clusters drawn with replacement (`cluster_weights`); NaN where a draw
    lacks erroneous or clean rows, as `processbench_scores` gives."""
    weights = cluster_weights(clusters, resamples, rng).astype(np.float64)  # [B, rows]
    err = label != -1
    hit = np.where(err, pred == label, pred == -1)
    n_err, n_clean = weights @ err, weights @ ~err
    with np.errstate(invalid="ignore", divide="ignore"):
        acc_error, acc_correct = 100.0 * (weights @ (hit & err)) / n_err, 100.0 * (weights @ (hit & ~err)) / n_clean
    return np.where((n_err > 0) & (n_clean > 0), _f1(np.nan_to_num(acc_error), np.nan_to_num(acc_correct)), np.nan)


def flag_step(n_steps: np.ndarray, k: int) -> np.ndarray:
    """The content-free rule "the first error is step k when there are more than k steps, else none"."""
    return np.where(np.asarray(n_steps) > k, k, -1)


def tune_flag_step(n_steps: np.ndarray, label: np.ndarray, max_k: int = 20) -> tuple[int, float]:
    """(k, F1) of the best `flag_step` rule on labelled rows; ties go to the smaller k."""
    f1 = [processbench_scores(flag_step(n_steps, k), label)["f1"] for k in range(max_k + 1)]
    k = int(np.nanargmax(f1))
    return k, float(f1[k])
