import json

import numpy as np
import pytest

from biprm.analysis import (
    aggregation_table,
    case_studies,
    error_onset,
    format_aggregation_table,
    format_perturbation_table,
    long_chain_bon,
    long_chain_processbench,
    mae_by_position,
    perturbation_robustness,
    pick_cases,
    plot_mae_by_position,
    plot_sigma_by_position,
    sigma_by_position,
)
from biprm.analysis.plots import plot_intervals
from biprm.data.trajectory import Trajectory
from biprm.scoring.step_scores import StepScores


def scores(*streams):
    """StepScores from per-trajectory lists of probabilities: fused[, l2r, r2l, sigma]."""
    lengths = [len(x) for x in streams[0]]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = [np.concatenate([np.asarray(x, dtype=float) for x in s]) for s in streams]
    return StepScores.from_probs(offsets, *flat)


# Five labelled trajectories (2 or 4 steps, so bins=2 splits them evenly):
#   T0 gsm8k  [1, 0]        first error 1      T3 math [1, 1, 0, 0]  first error 2
#   T1 gsm8k  [1, 1, 1, 1]  clean              T4 math [1, 1]        clean
#   T2 math   [0, 0]        first error 0
LABELS = [[1, 0], [1, 1, 1, 1], [0, 0], [1, 1, 0, 0], [1, 1]]
SUBSET = ["gsm8k", "gsm8k", "math", "math", "math"]
TRAJS = [
    Trajectory(
        f"Q{i}: is 3 < 4?",
        [f"t{i} step {t + 1} | ok" for t in range(len(y))],
        [float(v) for v in y],
        meta={"subset": s},
    )
    for i, (y, s) in enumerate(zip(LABELS, SUBSET))
]
BI_FUSED = [[0.9, 0.2], [0.8, 0.9, 0.7, 0.6], [0.3, 0.1], [0.9, 0.8, 0.4, 0.2], [0.9, 0.7]]
L2R = [[0.9, 0.45], [0.9, 0.9, 0.8, 0.8], [0.8, 0.4], [0.9, 0.9, 0.3, 0.2], [0.6, 0.55]]
R2L = [[0.95, 0.1], [0.7, 0.8, 0.6, 0.5], [0.2, 0.05], [0.9, 0.7, 0.9, 0.1], [0.9, 0.8]]
SIGMA = [[0.2, 0.6], [0.1, 0.3, 0.5, 0.7], [0.3, 0.5], [0.2, 0.4, 0.6, 0.8], [0.1, 0.9]]
SCORES = {"bi": scores(BI_FUSED, L2R, R2L, SIGMA), "l2r": scores(L2R, L2R)}


def test_error_onset():
    # (f + 0.5) / T over T0, T2, T3: 1.5/2, 0.5/2, 2.5/4
    assert error_onset(TRAJS) == pytest.approx((0.75 + 0.25 + 0.625) / 3)


def test_mae_by_position():
    r = mae_by_position(TRAJS, SCORES, bins=2)
    # bi |p - y|, first half | second half:
    #   T0 .1 | .2   T1 .2 .1 | .3 .4   T2 .3 | .1   T3 .1 .2 | .4 .2   T4 .1 | .3
    assert r["curves"]["bi"]["mean"] == pytest.approx([1.1 / 7, 1.9 / 7])
    assert r["curves"]["bi"]["count"] == [7, 7]
    assert r["curves"]["bi"]["overall"] == pytest.approx(3.0 / 14)
    #   T0 .1 | .45  T1 .1 .1 | .2 .2   T2 .8 | .4   T3 .1 .1 | .3 .2   T4 .4 | .45
    assert r["curves"]["l2r"]["mean"] == pytest.approx([1.7 / 7, 2.2 / 7])
    assert r["curves"]["l2r"]["position"] == [0.25, 0.75]
    assert r["error_onset"] == pytest.approx(1.625 / 3)
    assert (r["n_erroneous"], r["n_trajectories"]) == (3, 5)
    json.dumps(r)


def test_mae_uses_only_scored_steps():
    # the scorer cut T1 to its first two steps: labels must follow the scores, not the flat label list
    cut = scores([[0.9, 0.2], [0.8, 0.9], [0.3, 0.1], [0.9, 0.8, 0.4, 0.2], [0.9, 0.7]])
    r = mae_by_position(TRAJS, {"bi": cut}, bins=2)
    # errors: T0 .1 .2, T1 .2 .1, T2 .3 .1, T3 .1 .2 .4 .2, T4 .1 .3
    assert r["curves"]["bi"]["overall"] == pytest.approx(2.3 / 12)
    with pytest.raises(ValueError, match="do not belong"):
        mae_by_position(TRAJS[:4], {"bi": cut})


def test_sigma_by_position():
    r = sigma_by_position(SCORES["bi"], bins=2)
    assert r["curve"]["mean"] == pytest.approx([1.6 / 7, 4.6 / 7])
    assert r["curve"]["overall"] == pytest.approx(6.2 / 14)
    with pytest.raises(ValueError, match="gate"):
        sigma_by_position(SCORES["l2r"])


# Two questions x two candidates, one step score list per candidate.
POOL_QID = np.array([0, 0, 1, 1])
POOL_CORRECT = np.array([False, True, True, False])
POOL = {
    # Q0: min picks c1 (0.5 > 0.2, right), mean picks c0 (0.55 > 0.5, wrong); Q1: min and mean pick c0 (right)
    "bi": scores([[0.9, 0.2], [0.5, 0.5], [0.6, 0.7], [0.3, 0.95]]),
    "l2r": scores([[0.9, 0.8], [0.6, 0.7], [0.4, 0.9], [0.5, 0.7]]),
}


def test_aggregation_table():
    r = aggregation_table(POOL_QID, POOL_CORRECT, POOL, ns=(1, 2, 4))
    assert r["ns"] == [1, 2] and r["skipped"] == [4]
    # BoN@1 = 50 everywhere (first candidates: wrong, right); mean over n = (50 + BoN@2) / 2
    assert r["modes"]["bi"] == pytest.approx({"min": 75, "mean": 50, "prod": 75, "max": 25, "last": 50})
    assert r["modes"]["l2r"] == pytest.approx({"min": 25, "mean": 50, "prod": 50, "max": 50, "last": 50})
    assert r["best"] == {"bi": "min", "l2r": "mean"}
    text = format_aggregation_table(r)
    assert "| bi | **75.00** | 50.00 | **75.00** | 25.00 | 50.00 |" in text
    assert "| l2r | 25.00 | **50.00** | **50.00** | **50.00** | **50.00** |" in text
    assert "| mode | min | mean | prod | max | last |" in text


def test_long_chain_bon():
    qid = np.repeat([0, 1], 4)
    lengths = np.array([50, 150, 200, 120, 300, 80, 90, 110])  # long (> 100): Q0 c1-c3, Q1 c0 and c3
    correct = np.array([0, 1, 1, 0, 1, 0, 1, 0], dtype=bool)
    pool = {
        "bi": scores([[v] for v in [0.9, 0.3, 0.8, 0.5, 0.2, 0.9, 0.7, 0.6]]),
        "bi-static": scores([[v] for v in [0.1, 0.2, 0.3, 0.4, 0.5, 0.4, 0.3, 0.2]]),
    }
    r = long_chain_bon(qid, correct, pool, lengths, threshold=100, ns=(1, 2, 4))
    assert r["full"]["bi"]["bon"] == pytest.approx({1: 50, 2: 0, 4: 0})
    assert r["full"]["bi"]["mean"] == pytest.approx(50 / 3)
    assert r["full"]["bi-static"]["mean"] == pytest.approx(200 / 3)
    # long pools: Q0 [.3 T, .8 T, .5 F], Q1 [.2 T, .6 F]; no question keeps 4 long candidates
    long = r["long"]["bi"]
    assert long["bon"][1] == 100 and long["bon"][2] == 50 and np.isnan(long["bon"][4])
    assert long["questions"] == {1: 2, 2: 2, 4: 0}
    assert long["mean"] == pytest.approx(75)
    assert r["long"]["bi-static"]["mean"] == pytest.approx(100)
    assert r["relative_drop"]["bi"] == pytest.approx(-350)
    assert (r["n_full"], r["n_long"]) == (8, 5)
    assert (r["avg_len_full"], r["avg_len_long"]) == (137.5, 176.0)
    assert r["ns"] == [1, 2, 4]


def test_long_chain_processbench():
    lengths = np.array([1500, 1100, 700, 2000, 1030])  # T2 is the only short one
    r = long_chain_processbench(TRAJS, SCORES, lengths, threshold=1024)
    # l2r at 0.5: T0 -> 1 ok, T1 -> -1 ok, T2 -> 1 (label 0) wrong, T3 -> 2 ok, T4 -> -1 ok
    # full: gsm8k F1 100; math acc_err 50, acc_correct 100 -> F1 66.7; long: all right
    assert r["full"]["l2r"]["subsets"]["math"]["f1"] == pytest.approx(200 / 3)
    assert r["full"]["l2r"]["average_f1"] == pytest.approx(250 / 3)
    assert r["long"]["l2r"]["average_f1"] == pytest.approx(100)
    assert r["long"]["bi"]["average_f1"] == pytest.approx(100)
    assert r["relative_drop"]["l2r"] == pytest.approx(-20)
    assert (r["n_long"], r["avg_len_full"], r["avg_len_long"]) == (4, 1266.0, 1407.5)


def test_perturbation_robustness():
    # hand-made perturbed versions: T0 merged (1 step, f=0), T1 + filler (5 clean), T2 split (3 steps, f=0),
    # T3 + filler at 0 (5 steps, f=3), T4 merged (1 clean step)
    perturbed_labels = [[0], [1] * 5, [0, 0, 0], [1, 1, 1, 0, 0], [1]]
    perturbed = [
        Trajectory(t.question, [f"p{i} {k}" for k in range(len(y))], [float(v) for v in y], meta=dict(t.meta))
        for i, (t, y) in enumerate(zip(TRAJS, perturbed_labels))
    ]
    perturbed_scores = {
        # predictions 0, -1, 0, 4 (f=3: wrong), -1 -> gsm8k F1 100, math 2*50*100/150
        "bi": scores([[0.3], [0.8, 0.9, 0.6, 0.7, 0.6], [0.3, 0.2, 0.1], [0.9, 0.9, 0.8, 0.6, 0.2], [0.8]]),
        # predictions -1, -1, 2, 3, 0 -> gsm8k acc_err 0 (F1 0); math acc_correct 0 (F1 0)
        "l2r": scores([[0.7], [0.9] * 5, [0.8, 0.7, 0.4], [0.9, 0.9, 0.9, 0.3, 0.2], [0.4]]),
    }
    r = perturbation_robustness(SCORES, perturbed_scores, TRAJS, perturbed)
    assert r["columns"] == ["gsm8k", "math", "average"]
    bi, l2r = r["modes"]["bi"], r["modes"]["l2r"]
    assert bi["clean"] == pytest.approx({"gsm8k": 100, "math": 100, "average": 100})
    assert bi["perturbed"] == pytest.approx({"gsm8k": 100, "math": 200 / 3, "average": 250 / 3})
    assert bi["drop"] == pytest.approx({"gsm8k": 0, "math": 100 / 3, "average": 50 / 3})
    assert l2r["clean"] == pytest.approx({"gsm8k": 100, "math": 200 / 3, "average": 250 / 3})
    assert l2r["drop"] == pytest.approx({"gsm8k": 100, "math": 200 / 3, "average": 250 / 3})
    text = format_perturbation_table(r)
    assert "| mode | GSM8K | MATH | Average |" in text
    assert "| bi | **100.0** (↓0.0) | **66.7** (↓33.3) | **83.3** (↓16.7) |" in text
    assert "| l2r | 0.0 (↓100.0) | 0.0 (↓66.7) | 0.0 (↓83.3) |" in text
    # a per-mode threshold: l2r at 0.35 on clean T4 [.6, .55] still clean, T2 [.8, .4] now missed
    tuned = perturbation_robustness(SCORES, perturbed_scores, TRAJS, perturbed, threshold={"bi": 0.5, "l2r": 0.35})
    assert tuned["threshold"] == {"bi": 0.5, "l2r": 0.35}
    assert tuned["modes"]["l2r"]["clean"]["math"] == pytest.approx(200 / 3)


def test_pick_cases():
    # at the first error (bi fused p, l2r l, r2l r): T0 (.2, .45, .1), T2 (.3, .8, .2), T3 (.4, .3, .9)
    # successes (p < .5) by l - p: T2 .5, T0 .25, T3 -.1; failures (r >= .5): T3
    assert pick_cases(TRAJS, SCORES, k=3) == [2, 0, 3]
    assert pick_cases(TRAJS, SCORES, k=2) == [2, 3]
    assert pick_cases(TRAJS, SCORES, k=1) == [2]
    assert pick_cases(TRAJS, SCORES, k=5) == [2, 0, 3]


def test_case_studies():
    md, page = case_studies(TRAJS, SCORES, [3, 1])
    assert "## Case 1: item 3 (subset math), first error at step 3" in md
    assert "## Case 2: item 1 (subset gsm8k), no wrong step" in md
    assert "| Step | Text | Label | BiPRM | L2R-PRM | BiPRM: L2R | BiPRM: R2L | BiPRM: σ |" in md
    # T3 step 3: label 0, bi .4, l2r .3 (mode and stream), r2l .9, sigma .6; the pipe in the text is escaped
    assert "| **Step 3 (first error)** | **t3 step 3 \\| ok** | 0 | 0.40 | 0.30 | 0.30 | 0.90 | 0.60 |" in md
    assert "| Step 2 | t3 step 2 \\| ok | 1 | 0.80 | 0.90 | 0.90 | 0.70 | 0.40 |" in md
    assert md.count("first error)**") == 1
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert page.count('class="first-error"') == 1
    assert "Q3: is 3 &lt; 4?" in page
    assert '<td class="num">0.40</td><td class="num">0.30</td>' in page


def test_plots_write_png(tmp_path):
    for name, plot, result in [
        ("mae.png", plot_mae_by_position, mae_by_position(TRAJS, SCORES)),
        ("sigma.png", plot_sigma_by_position, sigma_by_position(SCORES["bi"])),
    ]:
        plot(result, str(tmp_path / name))
    cells = {"l2r": {"mean": 50.0, "low": 44.0, "high": 56.0}, "chance": {"mean": 18.0, "low": 17.0, "high": 19.0}}
    plot_intervals(
        str(tmp_path / "intervals.png"), {"primary": cells, "P1": {"l2r": cells["l2r"]}}, "endpoints", muted=("chance",)
    )
    for name in ("mae.png", "sigma.png", "intervals.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_scored_part_keeps_the_leading_scored_steps_of_each_trajectory():
    from biprm.analysis.common import scored_part

    flat = np.array([10, 11, 12, 20, 21, 30, 31, 32, 33])  # 3, 2 and 4 steps
    offsets = np.array([0, 2, 4, 5])  # the scorer kept 2, 2 and 1 of them
    assert scored_part(flat, np.array([3, 2, 4]), offsets).tolist() == [10, 11, 20, 21, 30]
    with pytest.raises(ValueError, match="do not belong"):
        scored_part(flat, np.array([1, 2, 4]), offsets)


def test_judged_rows_leaves_out_first_errors_past_the_scored_steps():
    from biprm.analysis.common import judged_rows

    trajs = [
        Trajectory("q", ["a", "b", "c"], [1, 1, 0]),
        Trajectory("q", ["a", "b"], [1, 0]),
        Trajectory("q", ["a"], [1]),
    ]
    part, first = judged_rows(trajs, scores([[0.9, 0.8], [0.7, 0.1], [0.6]]))  # row 1 lost its third (wrong) step
    assert (
        first.tolist() == [1, -1] and part.offsets.tolist() == [0, 2, 3] and np.allclose(part.prob(), [0.7, 0.1, 0.6])
    )


def test_boundary_agreement_counts_given_boundaries_found_and_cuts_near_one_by_hand():
    from biprm.analysis.boundaries import agreement, boundaries, even_cut, laid_out, near, row_counts

    assert laid_out(["ab", "c"], " ") == ("ab c", [[0, 2], [3, 4]])
    assert even_cut(10, 3) == [[0, 3], [3, 6], [6, 10]]
    assert (
        near([100], [0], 100) == 1 and near([101], [0], 100) == 0 and near([5], [], 100) == 0
    )  # the window is inclusive
    given, cut = [[0, 10], [12, 300], [302, 320]], [[0, 50], [51, 250], [251, 320]]
    assert boundaries(given) == [12, 302] and boundaries(cut) == [51, 251]
    assert row_counts(given, cut, 100) == (2, 2, 2, 2)  # 12 <-> 51 is 39 characters, 302 <-> 251 is 51
    assert row_counts(given, cut, 40) == (1, 2, 1, 2)
    # a second row of one given step has no boundary; its one cut (at 3) is near none
    result = agreement([given, [[0, 5]]], [cut, [[0, 2], [3, 5]]], within=40, resamples=200)
    assert result["found"]["mean"] == 0.5 and result["near"]["mean"] == pytest.approx(
        1 / 3
    )  # 1 of 2; (1 + 0) of (2 + 1)
    assert result["given_steps"] == 2.0 and result["cut_steps"] == 2.5 and result["rows"] == 2
    assert 0.0 <= result["found"]["low"] <= result["found"]["high"] <= 1.0
    with pytest.raises(ValueError, match="2 rows of given steps but 1 of cut steps"):
        agreement([given, given], [cut])


def test_a_first_error_predicted_on_a_recut_lands_on_the_given_step_that_holds_it():
    from biprm.analysis.boundaries import f1_interval, first_errors_on_given

    # row 0: re-cut into 3 steps; at 0.5 the third (chars 21-40) is the first below,
    # and char 21 is in given step 1 (12-40); at 0.65 the second (chars 6-20), which
    # starts in given step 0 (0-10). Row 1: at 0.5 none; at 0.65 its second step
    probs, offsets = np.array([0.9, 0.6, 0.2, 0.9, 0.62]), np.array([0, 3, 5])
    cuts = [[[0, 5], [6, 20], [21, 40]], [[0, 4], [5, 9]]]
    given = [[[0, 10], [12, 40]], [[0, 9]]]
    pred = first_errors_on_given(probs, offsets, 0.5, cuts, given)
    assert pred.tolist() == [1, -1]
    assert first_errors_on_given(probs, offsets, 0.65, cuts, given).tolist() == [0, 0]
    with pytest.warns(RuntimeWarning, match="All-NaN"):  # no clean row: F1 is undefined, and so is its interval
        assert np.isnan(f1_interval(pred, np.array([1, 0]), resamples=20)["mean"])
    assert f1_interval(pred, np.array([1, -1]), resamples=20)["mean"] == 100.0
    assert f1_interval(pred, np.array([0, -1]), resamples=20)["mean"] == 0.0  # right on clean rows, wrong on the rest
