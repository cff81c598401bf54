"""Solution-level metrics over candidate pools: Best-of-N, the content-free baselines, pass@n and votes.

Candidates arrive flat, one entry per candidate; the candidates of one question are
contiguous and in pool order. Which n candidates a question offers is the protocol:

- "first": its first n, in pool order (the paper's protocol: in a pool stacked by policy,
  n then also decides which policies are present);
- "random": `draws` uniform n-subsets of its pool, the value averaged over them.

Every metric is computed per question, as an expectation: over the subsets, and over
ties, which are broken uniformly (a tie never goes to the pool's first candidate, which
would let pool order pose as skill). Per-question values are what the bootstrap over
questions (biprm.metrics.bootstrap) resamples; a table's number is their mean, in %.

A candidate's `score` is its solution logit (`StepScores.solution_logits`): the ranking
needs no other property, and the weighted vote weighs each answer by sigmoid(score).
Answer keys must be mutually comparable (e.g. all str): give unparsed answers distinct keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from biprm.scoring.aggregate import aggregate, sigmoid

DEFAULT_NS = (8, 16, 32, 64, 128)
PROTOCOLS = ("first", "random")


def pool_bounds(qid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and size of every question's pool, in order of appearance."""
    qid = np.asarray(qid)
    if qid.ndim != 1 or len(qid) == 0:
        raise ValueError("qid must be a non-empty 1-D array")
    starts = np.concatenate([[0], np.flatnonzero(qid[1:] != qid[:-1]) + 1])
    if len(np.unique(qid[starts])) != len(starts):
        raise ValueError("the candidates of one question must be contiguous in qid")
    return starts, np.diff(np.append(starts, len(qid)))


def subsets(qid: np.ndarray, n: int, protocol: str = "first", draws: int = 100, seed: int = 0) -> np.ndarray:
    """[D, Q, n] flat candidate indices: D = 1 for "first", `draws` for "random"."""
    starts, sizes = pool_bounds(qid)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if sizes.min() < n:  # a silent smaller n would skew the comparison
        raise ValueError(
            f"n={n} exceeds the pool of {int((sizes < n).sum())} question(s) (smallest pool: {sizes.min()})"
        )
    if protocol == "first":
        return (starts[:, None] + np.arange(n))[None]
    if protocol != "random":
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {PROTOCOLS}")
    keys = np.random.default_rng(seed).random((draws, len(starts), sizes.max()))
    keys[:, np.arange(sizes.max()) >= sizes[:, None]] = np.inf  # past a question's pool
    return starts[None, :, None] + np.sort(np.argpartition(keys, n - 1, axis=2)[:, :, :n], axis=2)


def _scores(score: np.ndarray) -> np.ndarray:
    score = np.asarray(score, dtype=np.float64)
    if np.isnan(score).any():
        raise ValueError("score contains NaN, which no ranking can order")
    return score


def _top(values: np.ndarray) -> np.ndarray:
    """Mask of the entries equal to their row's maximum (the last axis)."""
    return values == values.max(axis=-1, keepdims=True)


def best_of(idx: np.ndarray, score: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[Q] chance that the top-scored candidate is correct, ties broken uniformly."""
    top = _top(_scores(score)[idx])
    hit = (top & np.asarray(correct, dtype=bool)[idx]).sum(-1) / top.sum(-1)
    return hit.mean(0)


def random_pick(idx: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[Q] chance that a uniformly picked candidate is correct: what a scorer that reads nothing gets."""
    return np.asarray(correct, dtype=float)[idx].mean(-1).mean(0)


def pass_any(idx: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[Q] oracle ceiling: some candidate is correct."""
    return np.asarray(correct, dtype=bool)[idx].any(-1).mean(0)


def tie_share(idx: np.ndarray, score: np.ndarray) -> np.ndarray:
    """[Q] whether the top score is shared: there the pick is a coin, not the scorer."""
    return (_top(_scores(score)[idx]).sum(-1) > 1).mean(0)


def vote(idx: np.ndarray, answer_key: np.ndarray, weight: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[Q] chance that the heaviest answer (summed weight) is a correct one, ties between answers uniform.

    An answer counts as correct when one of its candidates is.
    """
    D, Q, n = idx.shape
    _, code = np.unique(np.asarray(answer_key)[idx].ravel(), return_inverse=True)
    width = int(code.max()) + 1
    keys, group = np.unique(np.repeat(np.arange(D * Q), n) * width + code, return_inverse=True)
    total = np.bincount(group, weights=np.asarray(weight, dtype=float)[idx].ravel())
    good = np.bincount(group, weights=np.asarray(correct, dtype=float)[idx].ravel()) > 0
    row = keys // width  # the (draw, question) of every answer group, ascending
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    heaviest = total == np.repeat(np.maximum.reduceat(total, starts), np.diff(np.r_[starts, len(total)]))
    hits = np.bincount(row, weights=heaviest & good, minlength=D * Q)
    return (hits / np.bincount(row, weights=heaviest, minlength=D * Q)).reshape(D, Q).mean(0)


def majority(idx: np.ndarray, answer_key: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[Q] self-consistency with fair ties: the most frequent answer, a tie between answers a coin."""
    return vote(idx, answer_key, np.ones(np.asarray(correct).shape), correct)


def noise_best_of(
    idx: np.ndarray, offsets: np.ndarray, correct: np.ndarray, how: str, draws: int = 200, seed: int = 0
) -> np.ndarray:
    """[Q] BoN of i.i.d. standard-normal step logits under aggregation `how`, averaged over `draws`.

    It reads no text, only the step count: under `min` it prefers short solutions, under
    `max` long ones. A PRM that does not beat it has learned nothing its aggregation did not give it.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.mean(
        [best_of(idx, aggregate(rng.standard_normal(offsets[-1]), offsets, how), correct) for _ in range(draws)], axis=0
    )


def content_free(
    idx: np.ndarray,
    n_steps: np.ndarray,
    correct: np.ndarray,
    answer_key: np.ndarray,
    how: str,
    offsets: np.ndarray,
    draws: int = 200,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """[Q] values of every scorer that reads no step text, for one protocol's subsets `idx`."""
    n_steps = np.asarray(n_steps, dtype=np.float64)
    return {
        "random pick": random_pick(idx, correct),
        "majority vote (fair ties)": majority(idx, answer_key, correct),
        "fewest steps": best_of(idx, -n_steps, correct),
        "most steps": best_of(idx, n_steps, correct),
        f"noise + {how}": noise_best_of(idx, offsets, correct, how, draws, seed),
        "pass@n (oracle)": pass_any(idx, correct),
    }


def bon_at_n(
    qid: np.ndarray,
    score: np.ndarray,
    correct: np.ndarray,
    n: int,
    protocol: str = "first",
    draws: int = 100,
    seed: int = 0,
) -> float:
    """Best-of-n accuracy (%), ties broken uniformly."""
    return 100.0 * float(best_of(subsets(qid, n, protocol, draws, seed), score, correct).mean())


def bon_table(
    qid: np.ndarray,
    score: np.ndarray,
    correct: np.ndarray,
    answer_key: np.ndarray,
    ns: Sequence[int] = DEFAULT_NS,
    protocol: str = "first",
    draws: int = 100,
    seed: int = 0,
) -> dict:
    """BoN, pass, random pick, fair majority, weighted vote and tie share for every n that fits the smallest pool.

    Returns {"ns": used, "skipped": ns larger than the smallest pool, "protocol", and per metric
    ("bon", "pass", "chance", "majority", "weighted", "tie") {n: %}, "mean": {metric: mean over used n}}.
    """
    _, sizes = pool_bounds(qid)
    used = [n for n in ns if n <= sizes.min()]
    if not used:
        raise ValueError(f"no n in {tuple(ns)} fits the smallest pool ({sizes.min()} candidates)")
    score = _scores(score)
    table: dict[str, dict[int, float]] = {k: {} for k in ("bon", "pass", "chance", "majority", "weighted", "tie")}
    for n in used:
        idx = subsets(qid, n, protocol, draws, seed)
        values = {
            "bon": best_of(idx, score, correct),
            "pass": pass_any(idx, correct),
            "chance": random_pick(idx, correct),
            "majority": majority(idx, answer_key, correct),
            "weighted": vote(idx, answer_key, sigmoid(score), correct),
            "tie": tie_share(idx, score),
        }
        for k, v in values.items():
            table[k][n] = 100.0 * float(v.mean())
    mean = {name: float(np.mean(list(row.values()))) for name, row in table.items()}
    return {"ns": used, "skipped": [n for n in ns if n not in used], "protocol": protocol, **table, "mean": mean}
