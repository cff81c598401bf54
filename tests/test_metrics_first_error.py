import numpy as np
import pytest

from biprm.metrics.first_error import (
    first_error_f1_by_subset,
    predict_first_error,
    processbench_scores,
    tune_threshold,
)

# seven trajectories, flat probabilities + offsets
TRAJS = [
    ([0.9, 0.8, 0.2, 0.1], 2),  # pred@0.5 = 2  right
    ([0.9, 0.4, 0.3], 2),  # pred = 1      wrong (too early)
    ([0.3, 0.9], 0),  # pred = 0      right
    ([0.95, 0.9, 0.55], 1),  # pred = -1     wrong (missed)
    ([0.9, 0.7, 0.6], -1),  # pred = -1     right
    ([0.6, 0.45], -1),  # pred = 1      wrong (false alarm)
    ([0.8], -1),  # pred = -1     right
]


def flat(trajs):
    probs = np.concatenate([p for p, _ in trajs])
    offsets = np.concatenate([[0], np.cumsum([len(p) for p, _ in trajs])])
    return probs, offsets, np.array([y for _, y in trajs])


def test_predict_first_error():
    probs, offsets, _ = flat(TRAJS)
    assert predict_first_error(probs, offsets, 0.5).tolist() == [2, 1, 0, -1, -1, 1, -1]
    assert predict_first_error(probs, offsets, 0.0).tolist() == [-1] * 7
    assert predict_first_error(probs, offsets, 1.0).tolist() == [0] * 7


def test_scores_by_hand():
    probs, offsets, label = flat(TRAJS)
    s = processbench_scores(predict_first_error(probs, offsets, 0.5), label)
    # erroneous rows: 2 of 4 exact -> 50 %; clean rows: 2 of 3 -> 66.67 %
    assert s["acc_error"] == 50.0
    assert s["acc_correct"] == pytest.approx(200 / 3)
    # F1 = 2 * 50 * 66.67 / 116.67 = 400 / 7
    assert s["f1"] == pytest.approx(400 / 7)
    assert (s["n_error"], s["n_correct"]) == (4, 3)


def test_f1_zero_and_empty_groups():
    assert processbench_scores([0, 0], [1, -1])["f1"] == 0.0
    s = processbench_scores([1], [1])
    assert s["acc_error"] == 100.0 and np.isnan(s["acc_correct"]) and np.isnan(s["f1"])


TUNE = [
    ([0.9, 0.35, 0.2], 2),
    ([0.4, 0.25], 1),
    ([0.32, 0.38, 0.9], -1),
    ([0.28, 0.6], 0),
]


def test_tune_threshold_finds_0_3():
    # every row is right exactly for 0.28 < t <= 0.32; the default grid's only point there is 0.30
    probs, offsets, label = flat(TUNE)
    threshold, f1 = tune_threshold(probs, offsets, label)
    assert threshold == pytest.approx(0.30)
    assert f1 == 100.0
    # at the reference 0.5: preds 1, 0, 0, 0 -> 1/3 errors right, 0/1 clean right -> F1 0
    assert processbench_scores(predict_first_error(probs, offsets, 0.5), label)["f1"] == 0.0


def test_tune_tie_goes_closest_to_half():
    probs, offsets, label = flat(TUNE)
    # 0.29 and 0.31 both give F1 100; 0.31 is closer to 0.5
    assert tune_threshold(probs, offsets, label, grid=[0.1, 0.29, 0.31, 0.9]) == (0.31, 100.0)


def test_tune_matches_direct_evaluation():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 8, size=300)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    probs = np.round(rng.random(offsets[-1]), 2)  # rounding creates exact ties
    label = np.where(rng.random(300) < 0.5, -1, rng.integers(0, 8, 300) % lengths)
    grid = np.linspace(0.01, 0.99, 99)
    direct = [processbench_scores(predict_first_error(probs, offsets, t), label)["f1"] for t in grid]
    t, f1 = tune_threshold(probs, offsets, label, grid=grid)
    assert f1 == pytest.approx(max(direct))
    assert processbench_scores(predict_first_error(probs, offsets, t), label)["f1"] == pytest.approx(f1)
    t_exact, f1_exact = tune_threshold(probs, offsets, label)
    assert f1_exact >= f1 - 1e-9
    assert processbench_scores(predict_first_error(probs, offsets, t_exact), label)["f1"] == pytest.approx(f1_exact)


def test_tune_needs_both_kinds():
    with pytest.raises(ValueError):
        tune_threshold([0.1, 0.2], [0, 1, 2], [0, 0])


def test_by_subset():
    out = first_error_f1_by_subset([1, -1, 0, 2], [1, -1, 1, -1], ["math", "math", "gsm8k", "gsm8k"])
    assert list(out["subsets"]) == ["math", "gsm8k"]
    assert out["subsets"]["math"]["f1"] == 100.0
    assert out["subsets"]["gsm8k"]["f1"] == 0.0
    assert out["average_f1"] == 50.0


def test_flag_step_rule():
    from biprm.metrics.first_error import flag_step, tune_flag_step

    n_steps = np.array([2, 5, 5, 4, 1])
    assert flag_step(n_steps, 1).tolist() == [1, 1, 1, 1, -1]
    # labels: errors at step 1 on the three long rows, one clean 4-step row, one clean 1-step row
    label = np.array([-1, 1, 1, 1, -1])
    # k = 1: 3/3 errors found, 1/2 clean rows kept (only the 1-step one) -> F1 = 2 * 100 * 50 / 150 = 66.7
    # k = 0: 0 errors, 0 clean; k >= 5: 0 errors, 2/2 clean -> F1 0; k = 4 flags nothing of 2..4-step rows
    k, f1 = tune_flag_step(n_steps, label)
    assert (k, f1) == (1, pytest.approx(200 / 3))


def test_f1_intervals_resample_rows_within_each_subset():
    """Subset a is always right (F1 100 in every draw that holds both kinds of row), b always wrong (0), c has no
    erroneous row (no F1, no interval); the average's interval is the mean over subsets per draw, NaN when one subset
    has no F1. A mixed subset's interval holds its F1, and the same seed draws the same interval."""
    pred = np.array([0, -1, 1, -1, 2, -1, -1, -1])
    label = np.array([0, -1, 1, 0, -1, -1, -1, -1])
    where = np.array(["a", "a", "a", "b", "b", "b", "c", "c"])
    report = first_error_f1_by_subset(pred, label, where, resamples=200)
    assert report["subsets"]["a"]["f1_interval"] == [100.0, 100.0]
    assert report["subsets"]["b"]["f1_interval"] == [0.0, 0.0]
    assert np.isnan(report["subsets"]["c"]["f1"]) and np.isnan(report["subsets"]["c"]["f1_interval"]).all()
    assert np.isnan(report["average_f1_interval"]).all()
    two = first_error_f1_by_subset(pred[:6], label[:6], where[:6], resamples=200)
    assert two["average_f1"] == 50.0 and two["average_f1_interval"] == [50.0, 50.0]
    rng = np.random.default_rng(0)
    label = np.where(rng.random(200) < 0.5, -1, rng.integers(0, 5, 200))
    pred = np.where(rng.random(200) < 0.6, label, -1)
    mixed = first_error_f1_by_subset(pred, label, np.array(["m"] * 200), resamples=300, seed=3)["subsets"]["m"]
    low, high = mixed["f1_interval"]
    assert low < mixed["f1"] < high
    again = first_error_f1_by_subset(pred, label, np.array(["m"] * 200), resamples=300, seed=3)
    assert again["subsets"]["m"]["f1_interval"] == [low, high]
    assert "f1_interval" not in first_error_f1_by_subset(pred, label, np.array(["m"] * 200))["subsets"]["m"]


def test_clustered_f1_intervals_match_a_bootstrap_drawn_by_hand():
    """8 rows on 4 questions (one written twice with other case and spacing): each draw takes 4 questions with
    replacement and every row of each; the F1 interval is the percentiles of those draws' F1."""
    from biprm.metrics.bootstrap import question_clusters

    questions = ["Q a", "q  A", "Q b", "Q b", "Q b", "Q c", "Q d", "Q d"]
    label = np.array([-1, 1, 0, -1, 2, -1, 1, -1])
    pred = np.array([-1, 1, 1, -1, 2, 0, 1, 3])
    clusters = question_clusters(questions)
    assert clusters.tolist() == [0, 0, 1, 1, 1, 2, 3, 3]
    draws = np.random.default_rng(7).integers(4, size=(300, 4))
    by_hand = []
    for drawn in draws:
        rows = np.concatenate([np.flatnonzero(clusters == c) for c in drawn])
        by_hand.append(processbench_scores(pred[rows], label[rows])["f1"])
    report = first_error_f1_by_subset(pred, label, np.array(["s"] * 8), resamples=300, seed=7, clusters=clusters)
    assert report["subsets"]["s"]["f1_interval"] == pytest.approx(np.nanquantile(by_hand, [0.025, 0.975]))
    assert report["average_f1_interval"] == pytest.approx(report["subsets"]["s"]["f1_interval"])
    rows_alone = first_error_f1_by_subset(pred, label, np.array(["s"] * 8), resamples=300, seed=7)
    assert rows_alone["subsets"]["s"]["f1_interval"] != report["subsets"]["s"]["f1_interval"]
