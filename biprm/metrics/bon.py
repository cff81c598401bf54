"""Solution-level metrics over candidate pools: Best-of-N, pass@n and answer votes.

Candidates arrive flat, one entry per candidate; the candidates of one question are
contiguous and in pool order. Every @n metric reads the FIRST n candidates of each
question (the reference protocol), so a [Q, n] index matrix turns each metric into one
row-wise numpy reduction, whatever the pool sizes are. Answer keys must be mutually
comparable (e.g. all str, as np.unique sorts them): give unparsed answers one shared key.
A candidate's `score` is its solution logit (`StepScores.solution_logits`): the ranking
needs no other property, and the weighted vote weighs each answer by sigmoid(score).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from biprm.aggregate import sigmoid

DEFAULT_NS = (8, 16, 32, 64, 128)


def pool_bounds(qid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and size of every question's pool, in order of appearance."""
    qid = np.asarray(qid)
    if qid.ndim != 1 or len(qid) == 0:
        raise ValueError("qid must be a non-empty 1-D array")
    starts = np.concatenate([[0], np.flatnonzero(qid[1:] != qid[:-1]) + 1])
    if len(np.unique(qid[starts])) != len(starts):
        raise ValueError("the candidates of one question must be contiguous in qid")
    return starts, np.diff(np.append(starts, len(qid)))


def _check_n(sizes: np.ndarray, n: int) -> None:
    """The caller limits n to the pool size; a silent smaller n would skew the comparison."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if sizes.min() < n:
        raise ValueError(f"n={n} exceeds the pool of {int((sizes < n).sum())} question(s) (smallest pool: {sizes.min()})")


def first_n(qid: np.ndarray, n: int) -> np.ndarray:
    """[Q, n] flat indices of each question's first n candidates."""
    starts, sizes = pool_bounds(qid)
    _check_n(sizes, n)
    return starts[:, None] + np.arange(n)


def _scores(score: np.ndarray) -> np.ndarray:
    score = np.asarray(score, dtype=np.float64)
    if np.isnan(score).any():
        raise ValueError("score contains NaN, which argmax would silently pick")
    return score


def _best_correct(idx: np.ndarray, score: np.ndarray, correct: np.ndarray) -> float:
    """% of rows whose highest-scored candidate is correct; argmax breaks ties toward the earliest."""
    pick = idx[np.arange(len(idx)), np.argmax(score[idx], axis=1)]
    return 100.0 * float(np.mean(correct[pick]))


def bon_at_n(qid: np.ndarray, score: np.ndarray, correct: np.ndarray, n: int) -> float:
    """Best-of-n accuracy (%): the top-scored of the first n candidates, ties to the earliest."""
    return _best_correct(first_n(qid, n), _scores(score), np.asarray(correct, dtype=bool))


def tie_rate_at_n(qid: np.ndarray, score: np.ndarray, n: int) -> float:
    """% of questions whose top score among the first n is shared: there BoN picks by pool order, not by the PRM."""
    top = _scores(score)[first_n(qid, n)]
    return 100.0 * float(np.mean((top == top.max(axis=1, keepdims=True)).sum(axis=1) > 1))


def random_pick_at_n(qid: np.ndarray, correct: np.ndarray, n: int) -> float:
    """Expected accuracy (%) of picking one of the first n candidates uniformly: the chance baseline."""
    return 100.0 * float(np.mean(np.asarray(correct, dtype=float)[first_n(qid, n)]))


def pass_at_n(qid: np.ndarray, correct: np.ndarray, n: int) -> float:
    """Oracle ceiling (%): some candidate among the first n is correct."""
    return 100.0 * float(np.mean(np.asarray(correct, dtype=bool)[first_n(qid, n)].any(axis=1)))


def _vote(qid: np.ndarray, answer_key: np.ndarray, weight: np.ndarray, correct: np.ndarray, n: int) -> float:
    """% of rows whose heaviest answer (summed weight; ties to the answer seen first) is correct."""
    idx = first_n(qid, n)
    _, code = np.unique(np.asarray(answer_key)[idx].ravel(), return_inverse=True)
    code = code.reshape(idx.shape)
    rows = np.arange(len(idx))
    _, group = np.unique(rows[:, None] * (code.max() + 1) + code, return_inverse=True)
    total = np.bincount(group.ravel(), weights=weight[idx].ravel())[group.reshape(idx.shape)]
    winner = code[rows, np.argmax(total, axis=1)]
    hit = (code == winner[:, None]) & np.asarray(correct, dtype=bool)[idx]
    return 100.0 * float(np.mean(hit.any(axis=1)))


def majority_vote_at_n(qid: np.ndarray, answer_key: np.ndarray, correct: np.ndarray, n: int) -> float:
    """Self-consistency (%): the most frequent answer among the first n; correct if one of its candidates is."""
    return _vote(qid, answer_key, np.ones(len(np.asarray(qid))), correct, n)


def weighted_vote_at_n(qid: np.ndarray, answer_key: np.ndarray, score: np.ndarray, correct: np.ndarray, n: int) -> float:
    """PRM-weighted vote (%): the answer with the largest sum of solution probabilities among the first n."""
    return _vote(qid, answer_key, sigmoid(_scores(score)), correct, n)


def bon_random_subsets(
    qid: np.ndarray, score: np.ndarray, correct: np.ndarray, n: int, repeats: int = 100, seed: int = 0
) -> tuple[float, float, float]:
    """BoN@n over `repeats` random n-subsets of every pool: (mean, 2.5th, 97.5th percentile) in %.

    The interval is the percentile spread of the per-draw accuracies, so it measures how
    much the result depends on which candidates were drawn, not sampling error over
    questions. Inside a subset, ties still go to the earliest candidate in pool order.
    """
    starts, sizes = pool_bounds(qid)
    _check_n(sizes, n)
    score, correct = _scores(score), np.asarray(correct, dtype=bool)
    rng = np.random.default_rng(seed)
    padding = np.arange(sizes.max()) >= sizes[:, None]
    acc = np.empty(repeats)
    for r in range(repeats):
        keys = rng.random(padding.shape)
        keys[padding] = np.inf
        pos = np.sort(np.argpartition(keys, n - 1, axis=1)[:, :n], axis=1)
        acc[r] = _best_correct(starts[:, None] + pos, score, correct)
    low, high = np.percentile(acc, [2.5, 97.5])
    return float(acc.mean()), float(low), float(high)


def bon_table(
    qid: np.ndarray, score: np.ndarray, correct: np.ndarray, answer_key: np.ndarray, ns: Sequence[int] = DEFAULT_NS
) -> dict:
    """BoN, pass, random pick, majority and weighted vote for every n that fits the smallest pool, plus their means.

    Returns {"ns": used, "skipped": ns larger than the smallest pool, "bon"/"pass"/"chance" (random pick)/
    "majority"/"weighted"/"tie" (questions whose top score is shared): {n: %}, "mean": {metric: mean
    over used n}}; "mean"["bon"] is the paper's main-table number.
    """
    _, sizes = pool_bounds(qid)
    used = [n for n in ns if n <= sizes.min()]
    if not used:
        raise ValueError(f"no n in {tuple(ns)} fits the smallest pool ({sizes.min()} candidates)")
    metrics = {
        "bon": lambda n: bon_at_n(qid, score, correct, n),
        "pass": lambda n: pass_at_n(qid, correct, n),
        "chance": lambda n: random_pick_at_n(qid, correct, n),
        "majority": lambda n: majority_vote_at_n(qid, answer_key, correct, n),
        "weighted": lambda n: weighted_vote_at_n(qid, answer_key, score, correct, n),
        "tie": lambda n: tie_rate_at_n(qid, score, n),
    }
    table = {name: {n: fn(n) for n in used} for name, fn in metrics.items()}
    mean = {name: float(np.mean(list(row.values()))) for name, row in table.items()}
    return {"ns": used, "skipped": [n for n in ns if n not in used], **table, "mean": mean}
