"""Boundary agreement: how close a segmenter's cuts fall to the steps a dataset gives, by character offset.

ThinkBooster (guide §13) scores a step detector by the share of reference boundaries within 100 characters of one
of its cuts; that share alone rewards cutting everywhere, so the share of cuts near a reference boundary and the
steps per row stand beside it. A row is a trace cut twice: its given steps' `[start, end)` spans and a segmenter's,
in the same text (biprm.data.segment). Intervals resample rows.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from biprm.data.segment import first_error_on, step_at
from biprm.metrics.bootstrap import bootstrap_statistic
from biprm.metrics.first_error import predict_first_error, processbench_scores
from biprm.scoring.step_scores import StepScores

WITHIN = 100  # characters, as ThinkBooster counts a boundary found


def boundaries(offsets: Sequence[Sequence[int]]) -> list[int]:
    """Where each step after the first starts: the boundaries a cut of a trace draws (the text's start is none)."""
    return [int(start) for start, _ in offsets[1:]]


def laid_out(steps: Sequence[str], join: str) -> tuple[str, list[list[int]]]:
    """Given steps laid end to end with `join` between them: the text, and each step's [start, end) in it."""
    spans, at = [], 0
    for step in steps:
        spans.append([at, at + len(step)])
        at += len(step) + len(join)
    return join.join(steps), spans


def even_cut(length: int, n: int) -> list[list[int]]:
    """A text-free cut: `length` characters in `n` pieces of equal length (as many steps as given, no word read), the
    reference a segmenter must beat, since long steps put a boundary within reach of almost any cut."""
    bounds = [length * k // n for k in range(n + 1)]
    return [[a, b] for a, b in zip(bounds, bounds[1:])]


def near(points: Sequence[int], targets: Sequence[int], within: int = WITHIN) -> int:
    """How many of `points` have one of `targets` (sorted) within `within` characters."""
    found = 0
    for p in points:
        i = bisect_left(targets, p - within)
        found += i < len(targets) and targets[i] <= p + within
    return found


def row_counts(
    given: Sequence[Sequence[int]], cut: Sequence[Sequence[int]], within: int = WITHIN
) -> tuple[int, int, int, int]:
    """One row's (given boundaries found, given boundaries, cuts near a given boundary, cuts)."""
    g, c = boundaries(given), boundaries(cut)
    return near(g, c, within), len(g), near(c, g, within), len(c)


def agreement(
    given: Sequence[Sequence[Sequence[int]]],
    cuts: Sequence[Sequence[Sequence[int]]],
    within: int = WITHIN,
    resamples: int = 1000,
    seed: int = 0,
) -> dict:
    """Over rows (each row's given spans and a segmenter's spans of the same text): `found`, the share of given
    boundaries within `within` characters of a cut, and `near`, the share of cuts within `within` of a given boundary,
    each pooled over rows with a percentile interval over resampled rows ({"mean", "low", "high"}); and the mean steps
    per row, given and cut. A row with one given step has no boundary and counts only in the step means."""
    if len(given) != len(cuts):
        raise ValueError(f"{len(given)} rows of given steps but {len(cuts)} of cut steps")
    counts = np.array([row_counts(g, c, within) for g, c in zip(given, cuts)], dtype=np.float64).reshape(-1, 4)

    def share(hit: int, total: int):
        return lambda index: float(counts[index, hit].sum() / max(counts[index, total].sum(), 1.0))

    return {
        "rows": len(given),
        "found": bootstrap_statistic(share(0, 1), len(given), resamples, seed),
        "near": bootstrap_statistic(share(2, 3), len(given), resamples, seed),
        "given_steps": float(np.mean([len(g) for g in given])),
        "cut_steps": float(np.mean([len(c) for c in cuts])),
    }


def first_errors_on_given(
    probs: np.ndarray,
    offsets: np.ndarray,
    threshold: float,
    cuts: Sequence[Sequence[Sequence[int]]],
    given: Sequence[Sequence[Sequence[int]]],
) -> np.ndarray:
    """Each row's first error predicted on its re-cut steps (the first step below `threshold`; `probs` flat with
    `offsets`), as the given step that holds its first character (segment.first_error_on): the given labels then score
    any segmenter, so first-error F1 compares across them."""
    pred = predict_first_error(probs, offsets, threshold)
    return np.array([first_error_on(int(p), c, g) for p, c, g in zip(pred, cuts, given)], dtype=np.int64)


def f1_interval(pred: np.ndarray, label: np.ndarray, resamples: int = 1000, seed: int = 0) -> dict:
    """ProcessBench's first-error F1 (%) of `pred` against `label`, with a percentile interval over resampled rows."""
    return bootstrap_statistic(lambda i: processbench_scores(pred[i], label[i])["f1"], len(label), resamples, seed)


def onto_given(
    scores: StepScores, cuts: Sequence[Sequence[Sequence[int]]], given: Sequence[Sequence[Sequence[int]]]
) -> StepScores:
    """Scores of re-cut steps as scores of the given steps of the same texts: each given step takes the lowest logit of
    the cut steps that start in it (+inf where none starts: it cannot be flagged), in every stream. For any threshold
    the first given step below it is then the one holding the first character of the first cut step below it
    (`first_errors_on_given`), so every first-error metric, threshold tuning included, reads the given labels. A row
    holds the given steps up to the one where its last scored cut step ends; where --max-length left cut steps
    unscored, only up to the one where the last scored cut step starts (a later one could never be flagged)."""
    streams = {k: getattr(scores, k) for k in ("fused", "l2r", "r2l") if getattr(scores, k) is not None}
    out: dict[str, list[np.ndarray]] = {k: [] for k in streams}
    sizes = []
    for i, (cut, spans) in enumerate(zip(cuts, given)):
        a, b = scores.offsets[i], scores.offsets[i + 1]
        owner = np.array([step_at(spans, start) for start, _ in cut[: b - a]], dtype=np.int64)
        if b == a:
            n = 0
        elif b - a < len(cut):  # cut steps left unscored: a given step past the last scored start cannot be flagged
            n = owner[-1] + 1
        else:
            n = step_at(spans, cut[b - a - 1][1] - 1) + 1
        sizes.append(n)
        for k, values in streams.items():
            row = np.full(n, np.inf)
            np.minimum.at(row, owner, values[a:b])
            out[k].append(row)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}
    return StepScores(offsets, flat["fused"], flat.get("l2r"), flat.get("r2l"))
