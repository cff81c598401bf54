"""PRMBench's PRMScore: step-level F1 for both kinds of step, per error class and overall.

The definition, as the reference evaluation computes it (ssmisya/PRMBench,
mr_eval/tasks/prmtest_classified/task.py for the counts and F1s,
mr_visualize/eval_res_view/draw_tabs/form_latex_appendix.ipynb for the score):

* Every step of a process counts, steps after the first error included. A step is
  erroneous exactly when its number is in the row's `error_steps` (1-based, every wrong
  step, not only the first); see `prmbench_step_labels`.
* A step is predicted correct when its probability is strictly above the threshold
  (0.5 for probability PRMs), so p == threshold counts as a predicted error.
* Correct steps are the positive class. Counts are pooled over all steps of a group:
  tp = correct & predicted correct, fn = correct & predicted wrong,
  tn = wrong & predicted wrong,     fp = wrong & predicted correct.
  f1_positive = 2tp / (2tp + fp + fn), f1_negative = 2tn / (2tn + fn + fp).
* PRMScore = (f1_positive + f1_negative) / 2. multi_solutions, whose processes have no
  wrong step, is scored by f1_positive alone.
* "overall" pools the counts of every step of every modified process of every class
  (multi_solutions too) and takes 0.5 / 0.5 again: it is not a mean over classes. The
  clean original processes form a class "correct", scored but left out of "overall".
  The paper's category columns (simplicity, soundness, sensitivity) are unweighted means
  of their classes' PRMScores; see `prmbench_category_scores`.

Departures, all in degenerate groups (the reference takes F1 = 2PR / (P + R) with -1 for
any 0/0 and lets that sentinel into the arithmetic):

* An F1 of a kind of step the group does not contain is NaN here, and PRMScore is then the
  F1 of the kind it does contain (which is how multi_solutions comes out, without naming
  it). The reference prints -1 there if the model never predicted that kind, else 0.
* A kind that is present but has no hit while the model did predict it (tp = 0 < fp,
  or tn = 0 < fn) has F1 0 here; the reference prints -1 (P = R = 0) and averages it in.
* Precision and recall over zero steps are NaN here, -1 in the reference.

Everything else matches the reference's formulas exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from biprm.data.trajectory import Trajectory
from biprm.metrics.bootstrap import cluster_weights, percentile_interval
from biprm.scoring.aggregate import segments

CORRECT_CLASS = "correct"
OVERALL = "overall"
PRMBENCH_CATEGORIES = {
    "simplicity": ("redundency", "circular"),
    "soundness": ("counterfactual", "step_contradiction", "domain_inconsistency", "confidence"),
    "sensitivity": ("missing_condition", "deception", "multi_solutions"),
}


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """100 * num / den, NaN where den is 0."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(100.0 * num, den, out=np.full(den.shape, np.nan), where=den > 0)


def _confusion(
    probs: np.ndarray, step_labels: np.ndarray, group: np.ndarray, n_groups: int, threshold: float
) -> np.ndarray:
    """[n_groups, 4] step counts (tn, fp, fn, tp) of every group, in one bincount."""
    probs = np.asarray(probs, dtype=np.float64)
    step_labels = np.asarray(step_labels)
    if probs.shape != step_labels.shape or probs.ndim != 1:
        raise ValueError(f"probs {probs.shape} and step_labels {step_labels.shape} must be 1-D and the same length")
    if np.isnan(probs).any():
        raise ValueError("probs contains NaN, which would silently count as a predicted error")
    if not np.isin(step_labels, (0, 1)).all():
        raise ValueError("step_labels must be 0 (erroneous step) or 1 (correct step)")
    code = 2 * step_labels.astype(np.int64) + (probs > threshold)
    return np.bincount(4 * group + code, minlength=4 * n_groups).reshape(n_groups, 4)


def _prm(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(PRMScore, f1_positive, f1_negative) in % of (tn, fp, fn, tp) counts along the last axis, any leading shape."""
    tn, fp, fn, tp = np.moveaxis(counts, -1, 0)
    f1_pos, f1_neg = _ratio(2 * tp, 2 * tp + fp + fn), _ratio(2 * tn, 2 * tn + fn + fp)
    has_pos, has_neg = tp + fn > 0, tn + fp > 0
    f1_pos[~has_pos], f1_neg[~has_neg] = np.nan, np.nan
    both = (f1_pos + f1_neg) / 2
    return np.where(has_pos & has_neg, both, np.where(has_pos, f1_pos, f1_neg)), f1_pos, f1_neg


def _scores(counts: np.ndarray) -> list[dict]:
    """PRMScore and its parts (in %) for every row of (tn, fp, fn, tp) counts."""
    tn, fp, fn, tp = counts.T
    prm, f1_pos, f1_neg = _prm(counts)
    cols = {
        "prm_score": prm,
        "f1_positive": f1_pos,
        "f1_negative": f1_neg,
        "precision_positive": _ratio(tp, tp + fp),
        "recall_positive": _ratio(tp, tp + fn),
        "precision_negative": _ratio(tn, tn + fn),
        "recall_negative": _ratio(tn, tn + fp),
    }
    ints = {"tp": tp, "fp": fp, "tn": tn, "fn": fn, "n_steps": counts.sum(axis=1)}
    return [
        {k: float(v[g]) for k, v in cols.items()} | {k: int(v[g]) for k, v in ints.items()} for g in range(len(counts))
    ]


def prm_score(probs: np.ndarray, step_labels: np.ndarray, threshold: float = 0.5) -> dict:
    """PRMScore of one pool of steps (flat, any trajectories), with its parts, in %.

    Keys: prm_score, f1_positive, f1_negative, precision_/recall_positive, precision_/
    recall_negative (NaN over zero steps), and the counts tp, fp, tn, fn, n_steps.
    Pooling ignores trajectory boundaries, so no offsets are needed here.
    """
    probs = np.asarray(probs, dtype=np.float64)
    return _scores(_confusion(probs, step_labels, np.zeros(len(probs), dtype=np.int64), 1, threshold))[0]


def prm_score_by_class(
    probs: np.ndarray,
    offsets: np.ndarray,
    step_labels: np.ndarray,
    classes: np.ndarray,
    threshold: float = 0.5,
    exclude_from_overall: Sequence[str] = (CORRECT_CLASS,),
) -> dict[str, dict]:
    """`prm_score` of every class (one label per trajectory, in order of first appearance),
    then "overall": the pooled steps of all classes but `exclude_from_overall`."""
    probs, starts, lengths = segments(probs, offsets)
    classes = np.asarray(classes).astype(str)
    if len(classes) != len(starts):
        raise ValueError(f"classes needs one entry per trajectory ({len(starts)}), got {len(classes)}")
    if OVERALL in classes:
        raise ValueError(f"{OVERALL!r} is reserved for the pooled score; rename that class")
    names, first, code = np.unique(classes, return_index=True, return_inverse=True)
    counts = _confusion(probs, step_labels, np.repeat(code, lengths), len(names), threshold)
    pooled = counts[~np.isin(names, list(exclude_from_overall))].sum(axis=0, keepdims=True)
    per = dict(zip(names.tolist(), _scores(counts)))
    return {name: per[name] for name in names[np.argsort(first)].tolist()} | {OVERALL: _scores(pooled)[0]}


def prm_score_intervals(
    probs: np.ndarray,
    offsets: np.ndarray,
    step_labels: np.ndarray,
    classes: np.ndarray,
    clusters: np.ndarray,
    resamples: int = 1000,
    seed: int = 0,
    threshold: float = 0.5,
    level: float = 0.95,
) -> dict[str, list[float]]:
    """{class: [low, high]} and "overall" (as `prm_score_by_class` pools it): 95 % intervals of PRMScore over
    questions. A resample draws the questions (`clusters`, one per trajectory: `bootstrap.question_clusters`) with
    replacement, each with all its processes (a question's original and its modified copies are not independent), by
    the same `bootstrap.cluster_weights` draws as the ProcessBench and Best-of-N intervals; the step counts of the
    drawn processes are pooled and scored again. Vectorised: [resamples, questions] weights times per-question
    counts."""
    _, starts, lengths = segments(np.asarray(probs, dtype=np.float64), offsets)
    names, first, code = np.unique(np.asarray(classes).astype(str), return_index=True, return_inverse=True)
    question = np.unique(clusters, return_inverse=True)[1]
    per_traj = _confusion(probs, step_labels, np.repeat(np.arange(len(starts)), lengths), len(starts), threshold)
    table = np.zeros((question.max() + 1, len(names), 4))
    np.add.at(table, (question, code), per_traj)
    weights = cluster_weights(np.arange(len(table)), resamples, np.random.default_rng(seed))
    drawn = np.einsum("bq,qkf->bkf", weights, table)  # [B, classes, 4]
    pooled = drawn[:, names != CORRECT_CLASS].sum(1)
    scores = np.concatenate([_prm(drawn)[0], _prm(pooled)[0][:, None]], axis=1)
    bounds = percentile_interval(scores, level, axis=0).T
    return dict(zip([*names[np.argsort(first)].tolist(), OVERALL], bounds[[*np.argsort(first), -1]].tolist()))


def prmbench_category_scores(
    by_class: Mapping[str, Mapping[str, float]], categories: Mapping[str, Sequence[str]] = PRMBENCH_CATEGORIES
) -> dict[str, float]:
    """The paper's category columns: the unweighted mean PRMScore (%) of each category's
    classes, for the categories whose classes are all in `by_class`."""
    return {
        cat: float(np.mean([by_class[c]["prm_score"] for c in members]))
        for cat, members in categories.items()
        if all(c in by_class for c in members)
    }


# ---- from PRMBench trajectories (biprm.data.readers.from_prmbench) ---------------------------


def prmbench_step_labels(trajs: Sequence[Trajectory]) -> np.ndarray:
    """Flat per-step labels as PRMScore reads them: 0 at every step listed in
    meta["error_steps"] (1-based; numbers past the end ignored), 1 elsewhere.

    The reader labels modified processes with the first-error convention, which would
    count the correct steps after an error as wrong; this undoes that. A trajectory
    without error_steps (the clean originals) keeps its own labels.
    """
    out = []
    for i, traj in enumerate(trajs):
        n = len(traj.steps)
        if "error_steps" in traj.meta:
            wrong = np.asarray(traj.meta["error_steps"], dtype=np.int64) - 1
            labels = np.ones(n)
            labels[wrong[wrong < n]] = 0.0
        elif traj.labels is not None:
            labels = np.asarray(traj.labels, dtype=np.float64)
        else:
            raise ValueError(f"trajectory {i} has neither meta['error_steps'] nor labels")
        out.append(labels)
    return np.concatenate(out) if out else np.zeros(0)


def prmbench_classes(trajs: Sequence[Trajectory]) -> np.ndarray:
    """One class per trajectory: meta["classification"], or "correct" for a clean original."""
    return np.array(
        [CORRECT_CLASS if t.meta.get("variant") == "original" else str(t.meta.get("classification")) for t in trajs]
    )


def prmbench_keep(trajs: Sequence[Trajectory]) -> np.ndarray:
    """Mask of the trajectories the reference scores: each (class, idx) once, and each clean
    original once per idx, taken from the redundency rows (the reader emits one per row)."""
    seen: set = set()
    keep = np.zeros(len(trajs), dtype=bool)
    for i, t in enumerate(trajs):
        original = t.meta.get("variant") == "original"
        if original and t.meta.get("classification") != "redundency":
            continue
        key = (CORRECT_CLASS if original else t.meta.get("classification"), t.meta.get("idx"))
        keep[i] = key[1] is None or key not in seen
        seen.add(key)
    return keep
