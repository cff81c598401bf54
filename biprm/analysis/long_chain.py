"""Appendix "long chains": the same metrics on sequences longer than `threshold` tokens.

`lengths` is one token count per candidate or trajectory: the length of its encoded
stream (prompt + steps, `biprm.data.encoding.Encoded.n_tokens`), as the paper keeps
"sequences > 1024 tokens".

Best-of-N on the long subset keeps only the long candidates, in pool order, so "the
first n" of a question means its first n long candidates; BoN@n is taken over the
questions that still hold at least n of them (their count is reported per n), and the
long mean averages the n of the full set that some question can still serve. Dropping
short candidates rather than whole questions is what isolates long sequences: a
question's pool mixes short and long solutions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from biprm.analysis.aggregation import bon_by_n, fitting_ns
from biprm.analysis.common import first_error_report, threshold_of
from biprm.data.trajectory import Trajectory
from biprm.metrics.selection import DEFAULT_NS
from biprm.scoring.step_scores import StepScores


def _split(lengths: np.ndarray, threshold: int) -> tuple[np.ndarray, dict]:
    """Indices of the long items, and the size and length statistics both results report."""
    lengths = np.asarray(lengths, dtype=np.float64)
    long = np.flatnonzero(lengths > threshold)
    stats = {
        "threshold": threshold,
        "n_full": len(lengths),
        "n_long": len(long),
        "avg_len_full": float(lengths.mean()),
        "avg_len_long": float(lengths[long].mean()) if len(long) else float("nan"),
    }
    return long, stats


def _relative_drop(full: float, long: float) -> float:
    """% of the full-set score lost on the long subset (negative: the long subset scores higher)."""
    return 100.0 * (full - long) / full if full else float("nan")


def long_chain_bon(
    qid: np.ndarray,
    correct: np.ndarray,
    scores: dict[str, StepScores],
    lengths: np.ndarray,
    threshold: int = 1024,
    ns: Sequence[int] = DEFAULT_NS,
    how: str = "min",
) -> dict:
    """Mean BoN per mode on all candidates and on the long ones (see the module docstring).

    Returns {"full": {mode: {"bon", "questions", "mean"}}, "long": {mode: ...},
    "relative_drop": {mode: %}, "ns", "threshold", "n_full", "n_long", "avg_len_full", "avg_len_long"};
    n_full/n_long count candidates.
    """
    qid, correct = np.asarray(qid), np.asarray(correct, dtype=bool)
    if len(lengths) != len(qid):
        raise ValueError(f"{len(lengths)} lengths for {len(qid)} candidates")
    long, stats = _split(lengths, threshold)
    used = fitting_ns(qid, ns)
    full, sub = {}, {}
    for mode, s in scores.items():
        score = s.solution_logits(how)
        full[mode] = bon_by_n(qid, score, correct, used)
        sub[mode] = bon_by_n(qid[long], score[long], correct[long], used) if len(long) else {"mean": float("nan")}
    drop = {mode: _relative_drop(full[mode]["mean"], sub[mode]["mean"]) for mode in scores}
    return {"full": full, "long": sub, "relative_drop": drop, "ns": used, **stats}


def long_chain_processbench(
    trajs: Sequence[Trajectory],
    scores: dict[str, StepScores],
    lengths: np.ndarray,
    threshold: int = 1024,
    pb_threshold: float | Mapping[str, float] = 0.5,
) -> dict:
    """First-error scores (ProcessBench protocol, per subset) per mode on all and on the long trajectories.

    Returns {"full": {mode: {"subsets", "average_f1"}}, "long": {mode: ...}, "relative_drop": {mode: %
    of average F1}, "threshold", "n_full", "n_long", "avg_len_full", "avg_len_long"}. A subset with
    no erroneous or no clean long row has a NaN F1, and so has the average.
    """
    if len(lengths) != len(trajs):
        raise ValueError(f"{len(lengths)} lengths for {len(trajs)} trajectories")
    long, stats = _split(lengths, threshold)
    long_trajs = [trajs[i] for i in long]
    full, sub = {}, {}
    for mode, s in scores.items():
        th = threshold_of(pb_threshold, mode)
        full[mode] = first_error_report(trajs, s, th)
        sub[mode] = first_error_report(long_trajs, s.select(long), th) if len(long) else {"average_f1": float("nan")}
    drop = {mode: _relative_drop(full[mode]["average_f1"], sub[mode]["average_f1"]) for mode in scores}
    return {"full": full, "long": sub, "relative_drop": drop, **stats}
