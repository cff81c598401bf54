"""Appendix "aggregation operators": mean Best-of-N of every mode under every step -> solution reduce."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from biprm.scoring.aggregate import AGGREGATIONS
from biprm.analysis.common import markdown_table
from biprm.metrics.selection import DEFAULT_NS, bon_at_n, pool_bounds
from biprm.scoring.step_scores import StepScores


def bon_by_n(qid: np.ndarray, score: np.ndarray, correct: np.ndarray, ns: Sequence[int]) -> dict:
    """BoN@n (%) over the questions holding at least n candidates (NaN when none does).

    Returns {"bon": {n: %}, "questions": {n: count}, "mean": mean over the n measured}.
    """
    qid, score, correct = np.asarray(qid), np.asarray(score), np.asarray(correct, dtype=bool)
    _, sizes = pool_bounds(qid)
    bon, questions = {}, {}
    for n in ns:
        keep = np.repeat(sizes >= n, sizes)
        questions[n] = int((sizes >= n).sum())
        bon[n] = bon_at_n(qid[keep], score[keep], correct[keep], n) if questions[n] else float("nan")
    measured = [v for v in bon.values() if not np.isnan(v)]
    return {"bon": bon, "questions": questions, "mean": float(np.mean(measured)) if measured else float("nan")}


def fitting_ns(qid: np.ndarray, ns: Sequence[int]) -> list[int]:
    """The n that every pool can serve, as `bon_table` uses them."""
    _, sizes = pool_bounds(np.asarray(qid))
    used = [n for n in ns if n <= sizes.min()]
    if not used:
        raise ValueError(f"no n in {tuple(ns)} fits the smallest pool ({sizes.min()} candidates)")
    return used


def aggregation_table(
    qid: np.ndarray,
    correct: np.ndarray,
    scores: dict[str, StepScores],
    ns: Sequence[int] = DEFAULT_NS,
    aggregations: Sequence[str] = AGGREGATIONS,
) -> dict:
    """Mean BoN over n (bon_table's ["mean"]["bon"]) per mode and aggregation.

    Returns {"ns", "skipped", "aggregations", "modes": {mode: {agg: %}}, "best": {mode: agg}};
    ties for best go to the earlier aggregation in `aggregations`.
    """
    used = fitting_ns(qid, ns)
    table = {
        mode: {how: bon_by_n(qid, s.solution_logits(how), correct, used)["mean"] for how in aggregations}
        for mode, s in scores.items()
    }
    best = {mode: max(row, key=row.get) for mode, row in table.items()}
    skipped = [n for n in ns if n not in used]
    return {"ns": used, "skipped": skipped, "aggregations": list(aggregations), "modes": table, "best": best}


def format_aggregation_table(result: dict) -> str:
    """Markdown: one row per mode, one column per aggregation, the best of each row (ties included) in bold."""
    aggs = result["aggregations"]
    rows = []
    for mode, row in result["modes"].items():
        top = max(row.values())
        rows.append([mode] + [f"**{row[a]:.2f}**" if row[a] >= top - 1e-9 else f"{row[a]:.2f}" for a in aggs])
    ns = ", ".join(str(n) for n in result["ns"])
    return f"Mean BoN@n (%) over n ∈ {{{ns}}}\n\n" + markdown_table(["mode", *aggs], rows)
