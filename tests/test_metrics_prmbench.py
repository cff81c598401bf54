import gzip
import json
import math

import numpy as np
import pytest

from biprm.metrics.prmbench import (
    PRMBENCH_CATEGORIES,
    prm_score,
    prm_score_by_class,
    prmbench_category_scores,
    prmbench_classes,
    prmbench_keep,
    prmbench_step_labels,
)
from biprm.data.readers import from_prmbench, load_trajectories
from biprm.data.trajectory import Trajectory, labels_from_first_error

approx = pytest.approx


def pair(idx, cls, n_orig, n_mod, errors):
    """The (original, modified) trajectories that biprm.data.readers.from_prmbench makes of one row."""
    meta = {"idx": idx, "classification": cls}
    original = Trajectory(
        "q", [f"o{t}" for t in range(n_orig)], labels=[1.0] * n_orig, meta={**meta, "variant": "original"}
    )
    modified = Trajectory(
        "q'",
        [f"m{t}" for t in range(n_mod)],
        labels=labels_from_first_error(min(errors, default=0) - 1, n_mod),
        meta={**meta, "variant": "modified", "error_steps": errors},
    )
    return [original, modified]


def same(a, b):
    """Two score dicts are equal, NaN matching NaN."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def flat(groups):
    """[(probs, labels, class), ...] -> flat probs, offsets, flat labels, classes."""
    probs = np.concatenate([p for p, _, _ in groups])
    offsets = np.concatenate([[0], np.cumsum([len(p) for p, _, _ in groups])])
    labels = np.concatenate([y for _, y, _ in groups])
    return probs, offsets, labels, np.array([c for _, _, c in groups])


def test_pair_matches_reader():
    row = {
        "idx": "p1_7",
        "classification": "circular",
        "original_question": "q",
        "modified_question": "q'",
        "original_process": ["o0", "o1", "o2"],
        "modified_process": ["m0", "m1", "m2", "m3"],
        "error_steps": [3, 2],
    }
    got = from_prmbench(row, "row 1")
    want = pair("p1_7", "circular", 3, 4, [3, 2])
    for g, w in zip(got, want):
        assert (g.labels, g.meta, len(g.steps)) == (w.labels, w.meta, len(w.steps))


# ---- prm_score -------------------------------------------------------------------------

PROBS = [0.9, 0.5, 0.2, 0.7, 0.4, 0.6, 0.51, 0.3]
LABELS = [1, 1, 0, 0, 1, 1, 0, 1]
# predicted correct iff p > 0.5:  T  F  F  T  F  T  T  F   (0.5 is not > 0.5: a predicted error)
# step outcome:                   tp fn tn fp fn tp fp fn
# tp = 2, fn = 3, tn = 1, fp = 2


def test_prm_score_by_hand():
    s = prm_score(PROBS, LABELS)
    assert (s["tp"], s["fn"], s["tn"], s["fp"], s["n_steps"]) == (2, 3, 1, 2, 8)
    assert s["f1_positive"] == approx(100 * 4 / 9)  # 2tp / (2tp + fp + fn) = 4 / (4 + 2 + 3)
    assert s["f1_negative"] == approx(100 * 2 / 7)  # 2tn / (2tn + fn + fp) = 2 / (2 + 3 + 2)
    assert s["prm_score"] == approx(100 * 23 / 63)  # (4/9 + 2/7) / 2 = (28 + 18) / 126 = 23/63 = 36.51 %
    assert s["precision_positive"] == approx(50.0)  # tp / (tp + fp) = 2 / 4
    assert s["recall_positive"] == approx(40.0)  # tp / (tp + fn) = 2 / 5
    assert s["precision_negative"] == approx(25.0)  # tn / (tn + fn) = 1 / 4
    assert s["recall_negative"] == approx(100 / 3)  # tn / (tn + fp) = 1 / 3
    assert all(isinstance(s[k], int) for k in ("tp", "fp", "tn", "fn", "n_steps"))


def test_prm_score_threshold_is_strictly_greater():
    # p == threshold is a predicted error: step 1 (p = 0.5, correct) is fn at 0.5 ...
    assert prm_score([0.5], [1])["fn"] == 1 and prm_score([0.5], [0])["tn"] == 1
    # ... and becomes tp once the threshold is below it: tp = 3, fn = 2, fp = 2, tn = 1
    s = prm_score(PROBS, LABELS, threshold=0.49)
    assert (s["tp"], s["fn"], s["tn"], s["fp"]) == (3, 2, 1, 2)
    assert s["f1_positive"] == approx(60.0)  # 6 / (6 + 2 + 2)
    # at 0.51, step 6 (p = 0.51, wrong) is no longer predicted correct: fp 2 -> 1, tn 1 -> 2
    s = prm_score(PROBS, LABELS, threshold=0.51)
    assert (s["tp"], s["fn"], s["tn"], s["fp"]) == (2, 3, 2, 1)


def test_prm_score_one_kind_of_step():
    # only correct steps (a multi_solutions group): PRMScore is f1_positive; tp = 2, fn = 1
    s = prm_score([0.9, 0.8, 0.1], [1, 1, 1])
    assert s["f1_positive"] == approx(80.0)  # 4 / (4 + 0 + 1)
    assert math.isnan(s["f1_negative"]) and s["prm_score"] == s["f1_positive"]
    # the model did predict one step wrong (fn = 1): precision- = 0 / 1, recall- = 0 / 0
    assert s["precision_negative"] == 0.0 and math.isnan(s["recall_negative"])
    # only wrong steps: PRMScore is f1_negative; tn = 1, fp = 1
    s = prm_score([0.2, 0.7], [0, 0])
    assert s["f1_negative"] == approx(100 * 2 / 3)  # 2 / (2 + 0 + 1)
    assert math.isnan(s["f1_positive"]) and s["prm_score"] == s["f1_negative"]


def test_prm_score_no_hits_is_zero_not_nan():
    # correct steps present, none recognised, some predicted correct: tp = 0, fn = 1, fp = 1, tn = 1
    s = prm_score([0.2, 0.9, 0.1], [1, 0, 0])
    assert s["f1_positive"] == 0.0 and s["precision_positive"] == 0.0 and s["recall_positive"] == 0.0
    assert s["f1_negative"] == approx(50.0)  # 2 / (2 + 1 + 1)
    assert s["prm_score"] == approx(25.0)
    # wrong steps present but never predicted wrong: tn = 0, fp = 1, fn = 0 -> F1- = 0, precision- is 0/0
    s = prm_score([0.9, 0.9], [1, 0])
    assert s["f1_negative"] == 0.0 and math.isnan(s["precision_negative"]) and s["recall_negative"] == 0.0
    assert s["prm_score"] == approx(100 * 2 / 3 / 2)  # f1+ = 2 / (2 + 1 + 0), averaged with 0


def test_prm_score_empty_is_nan():
    s = prm_score([], [])
    assert s["n_steps"] == 0 and all(math.isnan(s[k]) for k in ("prm_score", "f1_positive", "f1_negative"))


@pytest.mark.parametrize(
    ("probs", "labels", "match"),
    [
        ([0.1, 0.2], [1], "same length"),
        ([[0.1], [0.2]], [[1], [0]], "1-D"),
        ([0.1, float("nan")], [1, 0], "NaN"),
        ([0.1, 0.2], [1, 0.5], "0 .erroneous step. or 1"),
        ([0.1, 0.2], [1, 2], "0 .erroneous step. or 1"),
    ],
)
def test_prm_score_rejects_bad_input(probs, labels, match):
    with pytest.raises(ValueError, match=match):
        prm_score(probs, labels)


# ---- prm_score_by_class ----------------------------------------------------------------

GROUPS = [
    ([0.9, 0.8, 0.3], [1, 1, 0], "counterfactual"),  # tp tp tn
    ([0.9, 0.2], [1, 1], "correct"),  # tp fn
    ([0.7, 0.6], [1, 0], "deception"),  # tp fp
    ([0.4, 0.6], [1, 0], "counterfactual"),  # fn fp
    ([0.8, 0.5, 0.9], [1, 1, 1], "multi_solutions"),  # tp fn tp
]


def test_prm_score_by_class_by_hand():
    res = prm_score_by_class(*flat(GROUPS))
    # order of first appearance, then overall
    assert list(res) == ["counterfactual", "correct", "deception", "multi_solutions", "overall"]

    # counterfactual: tp = 2, fn = 1, tn = 1, fp = 1 (its two trajectories pooled)
    cf = res["counterfactual"]
    assert (cf["tp"], cf["fn"], cf["tn"], cf["fp"], cf["n_steps"]) == (2, 1, 1, 1, 5)
    assert cf["f1_positive"] == approx(100 * 4 / 6)  # 4 / (4 + 1 + 1)
    assert cf["f1_negative"] == approx(50.0)  # 2 / (2 + 1 + 1)
    assert cf["prm_score"] == approx(100 * 7 / 12)  # (2/3 + 1/2) / 2 = 58.33 %

    # correct: tp = 1, fn = 1, no wrong step -> f1_positive alone = 2 / (2 + 0 + 1)
    assert res["correct"]["prm_score"] == approx(100 * 2 / 3) and math.isnan(res["correct"]["f1_negative"])

    # deception: tp = 1, fp = 1 -> F1+ = 2 / 3, F1- = 0 / (0 + 0 + 1) = 0
    assert res["deception"]["f1_negative"] == 0.0 and res["deception"]["prm_score"] == approx(100 / 3)

    # multi_solutions: only correct steps, tp = 2, fn = 1 -> scored by f1_positive = 4 / 5
    ms = res["multi_solutions"]
    assert ms["prm_score"] == ms["f1_positive"] == approx(80.0) and math.isnan(ms["f1_negative"])

    # overall pools every step of every class but "correct" (multi_solutions included):
    # tp = 2 + 1 + 2 = 5, fn = 1 + 0 + 1 = 2, tn = 1, fp = 1 + 1 = 2
    ov = res["overall"]
    assert (ov["tp"], ov["fn"], ov["tn"], ov["fp"], ov["n_steps"]) == (5, 2, 1, 2, 10)
    assert ov["f1_positive"] == approx(100 * 10 / 14)  # 10 / (10 + 2 + 2)
    assert ov["f1_negative"] == approx(100 / 3)  # 2 / (2 + 2 + 2)
    assert ov["prm_score"] == approx(100 * 11 / 21)  # (5/7 + 1/3) / 2 = 22/42 = 52.38 %
    # ... which is not the mean of the class scores: (58.33 + 33.33 + 80) / 3 = 57.22
    assert ov["prm_score"] != approx(
        np.mean([res[c]["prm_score"] for c in ("counterfactual", "deception", "multi_solutions")])
    )


def test_prm_score_by_class_overall_can_include_correct():
    res = prm_score_by_class(*flat(GROUPS), exclude_from_overall=())
    # the "correct" steps (tp 1, fn 1) join the pool: tp = 6, fn = 3, tn = 1, fp = 2
    ov = res["overall"]
    assert (ov["tp"], ov["fn"], ov["tn"], ov["fp"]) == (6, 3, 1, 2)
    assert ov["prm_score"] == approx(100 * 59 / 119)  # (12/17 + 2/7) / 2 = (84 + 34) / 238
    assert same(res["correct"], prm_score_by_class(*flat(GROUPS))["correct"])


def test_prm_score_by_class_threshold():
    # at 0.45 the 0.5 step of multi_solutions becomes tp: tp = 3, fn = 0 -> 100 %
    assert prm_score_by_class(*flat(GROUPS), threshold=0.45)["multi_solutions"]["prm_score"] == approx(100.0)


def test_prm_score_by_class_rejects_bad_input():
    probs, offsets, labels, classes = flat(GROUPS)
    with pytest.raises(ValueError, match="one entry per trajectory"):
        prm_score_by_class(probs, offsets, labels, classes[:-1])
    with pytest.raises(ValueError, match="reserved"):
        prm_score_by_class(probs, offsets, labels, np.array([*classes[:-1], "overall"]))
    with pytest.raises(ValueError, match="offsets"):
        prm_score_by_class(probs, offsets[:-1], labels, classes[:-1])
    with pytest.raises(ValueError, match="at least one step"):
        prm_score_by_class(probs, np.array([0, 0, *offsets[1:]]), labels, np.array(["a", *classes]))
    with pytest.raises(ValueError, match="NaN"):
        prm_score_by_class(np.where(np.arange(len(probs)) == 3, np.nan, probs), offsets, labels, classes)
    with pytest.raises(ValueError, match="same length"):
        prm_score_by_class(probs, offsets, labels[:-1], classes)


# ---- from trajectories -----------------------------------------------------------------


def test_prmbench_step_labels():
    trajs = [
        # 5 steps, error_steps unsorted, 9 past the end: steps 2 and 4 wrong, 3 and 5 (after
        # the first error, not listed) correct; the reader's first-error labels are undone
        *pair("a", "circular", 3, 5, [4, 2, 9]),
        *pair("b", "multi_solutions", 2, 2, []),  # no wrong step
        *pair("c", "confidence", 1, 3, [1]),  # first step wrong
    ]
    assert trajs[1].labels == [1, 0, 0, 0, 0]
    got = prmbench_step_labels(trajs)
    assert got.tolist() == [1, 1, 1] + [1, 0, 1, 0, 1] + [1, 1] + [1, 1] + [1] + [0, 1, 1]
    assert prmbench_step_labels([]).shape == (0,)


def test_prmbench_step_labels_needs_labels_or_error_steps():
    with pytest.raises(ValueError, match="trajectory 1 has neither"):
        prmbench_step_labels([pair("a", "circular", 2, 2, [1])[0], Trajectory("q", ["s"])])


def test_prmbench_classes():
    trajs = pair("a", "circular", 2, 2, [1]) + pair("b", "multi_solutions", 2, 2, [])
    assert prmbench_classes(trajs).tolist() == ["correct", "circular", "correct", "multi_solutions"]


def test_prmbench_keep():
    trajs = [
        *pair("a", "redundency", 2, 2, [1]),  # original a (the clean one) kept, modified kept
        *pair("a", "redundency", 2, 2, [1]),  # a repeated row: both dropped
        *pair("a", "circular", 2, 2, [2]),  # originals of other classes dropped, modified kept
        *pair("b", "redundency", 2, 2, [2]),  # original b kept, modified kept
        *pair("a", "multi_solutions", 2, 2, []),  # same idx, another class: modified kept
    ]
    assert prmbench_keep(trajs).tolist() == [True, True, False, False, False, True, True, True, False, True]
    # without an idx nothing can be matched, so nothing is dropped
    no_idx = [Trajectory("q", ["s"], labels=[1.0], meta={"classification": "circular", "variant": "modified"})] * 2
    assert prmbench_keep(no_idx).tolist() == [True, True]


def test_prmbench_category_scores():
    by_class = {
        "redundency": {"prm_score": 60.0},
        "circular": {"prm_score": 40.0},
        "counterfactual": {"prm_score": 10.0},
        "step_contradiction": {"prm_score": 20.0},
        "domain_inconsistency": {"prm_score": 30.0},
        "confidence": {"prm_score": 80.0},
        "missing_condition": {"prm_score": 50.0},
        "deception": {"prm_score": 70.0},
    }
    # simplicity = (60 + 40) / 2; soundness = (10 + 20 + 30 + 80) / 4; sensitivity lacks multi_solutions
    assert prmbench_category_scores(by_class) == {"simplicity": 50.0, "soundness": 35.0}
    by_class["multi_solutions"] = {"prm_score": 90.0}
    assert prmbench_category_scores(by_class)["sensitivity"] == approx(70.0)  # (50 + 70 + 90) / 3
    assert prmbench_category_scores(by_class, {"mine": ("circular", "deception")}) == {"mine": 55.0}
    assert sum(len(v) for v in PRMBENCH_CATEGORIES.values()) == 9


def test_pipeline_from_trajectories():
    trajs = [
        *pair("a", "redundency", 2, 3, [2]),
        *pair("a", "circular", 2, 2, [1]),
        *pair("a", "circular", 2, 2, [1]),  # duplicate row
    ]
    keep = prmbench_keep(trajs)
    kept = [t for t, k in zip(trajs, keep) if k]
    assert [t.meta["variant"] for t in kept] == ["original", "modified", "modified"]
    labels = prmbench_step_labels(kept)  # [1, 1] + [1, 0, 1] + [0, 1]
    probs = np.array([0.9, 0.4] + [0.8, 0.3, 0.6] + [0.7, 0.2])
    offsets = np.cumsum([0] + [len(t.steps) for t in kept])
    res = prm_score_by_class(probs, offsets, labels, prmbench_classes(kept))
    assert list(res) == ["correct", "redundency", "circular", "overall"]
    # correct: tp fn; redundency: tp tn tp; circular: fp fn
    assert res["correct"]["prm_score"] == approx(100 * 2 / 3)  # 2 / (2 + 0 + 1)
    assert res["redundency"]["prm_score"] == approx(100.0)
    assert res["circular"]["prm_score"] == 0.0
    # overall (redundency + circular): tp = 2, tn = 1, fp = 1, fn = 1
    # F1+ = 4 / (4 + 1 + 1) = 2/3, F1- = 2 / (2 + 1 + 1) = 1/2 -> 7/12
    assert res["overall"]["prm_score"] == approx(100 * 7 / 12)


# ---- a real PRMBench file --------------------------------------------------------------


def test_real_prmbench_circular(data_dir):
    path = data_dir / "prmbench" / "classified" / "prm800k_test_p1_4o_circular.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found; this test reads a real PRMBench file")
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    trajs = load_trajectories(str(path), fmt="prmbench")
    assert len(trajs) == 2 * len(rows)

    keep = prmbench_keep(trajs)
    kept = [t for t, k in zip(trajs, keep) if k]
    # no redundency rows here, so no clean original is kept; each idx once
    n_idx = len({r["idx"] for r in rows})
    assert len(kept) == n_idx and all(t.meta["variant"] == "modified" for t in kept)
    assert set(prmbench_classes(kept).tolist()) == {"circular"}

    labels = prmbench_step_labels(kept)
    by_idx = {r["idx"]: r for r in reversed(rows)}  # the first row of each idx
    n_steps = sum(len(by_idx[t.meta["idx"]]["modified_process"]) for t in kept)
    assert len(labels) == n_steps == sum(len(t.steps) for t in kept)
    # wrong steps: the distinct listed numbers that fall inside the process (this file has a
    # row listing a step past its end, which must be ignored)
    assert any(e > len(r["modified_process"]) for r in by_idx.values() for e in r["error_steps"])
    n_wrong = sum(len({e for e in r["error_steps"] if e <= len(r["modified_process"])}) for r in by_idx.values())
    assert int((labels == 0).sum()) == n_wrong > 0
    # the first-error labels of the reader count at least as many wrong steps
    assert sum(t.labels.count(0.0) for t in kept) >= n_wrong

    # a PRM that calls every step correct: tp = correct steps, fp = wrong steps
    res = prm_score_by_class(
        np.ones(n_steps), np.cumsum([0] + [len(t.steps) for t in kept]), labels, prmbench_classes(kept)
    )
    assert list(res) == ["circular", "overall"] and same(res["circular"], res["overall"])
    assert (res["overall"]["tp"], res["overall"]["fp"], res["overall"]["n_steps"]) == (
        n_steps - n_wrong,
        n_wrong,
        n_steps,
    )
    assert res["overall"]["f1_negative"] == 0.0 and res["overall"]["recall_positive"] == 100.0


def test_prm_score_intervals_equal_a_bootstrap_over_questions_drawn_by_hand():
    """Three questions, each an original (class correct) and a modified copy (class a or b), one question written in
    two spellings: every draw takes whole questions, and the intervals equal PRMScore recomputed on each draw's
    processes, repeated as often as their question was drawn."""
    from biprm.metrics.bootstrap import cluster_weights, percentile_interval, question_clusters
    from biprm.metrics.prmbench import prm_score_intervals

    lengths = np.array([3, 3, 2, 2, 3, 3])
    probs = np.array([0.9, 0.8, 0.4, 0.9, 0.3, 0.2, 0.7, 0.6, 0.45, 0.8, 0.9, 0.95, 0.1, 0.7, 0.2, 0.9])
    labels = np.array([1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1])
    classes = np.array(["correct", "a", "correct", "b", "correct", "a"])
    questions = question_clusters(["Q one", "q  one", "Q two", "Q two", "Q three", "Q three"])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    got = prm_score_intervals(probs, offsets, labels, classes, questions, resamples=200, seed=3)
    weights = cluster_weights(np.arange(3), 200, np.random.default_rng(3))
    draws = {name: [] for name in ("correct", "a", "b", "overall")}
    for w in weights:
        rows = np.repeat(np.arange(6), w[questions])
        steps = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in rows])
        by_class = prm_score_by_class(
            probs[steps], np.concatenate([[0], np.cumsum(lengths[rows])]), labels[steps], classes[rows]
        )
        for name in draws:
            draws[name].append(by_class[name]["prm_score"] if name in by_class else np.nan)
    assert list(got) == ["correct", "a", "b", "overall"]
    for name, values in draws.items():
        assert got[name] == pytest.approx(percentile_interval(np.array(values)).tolist())
