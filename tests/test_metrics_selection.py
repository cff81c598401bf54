import numpy as np
import pytest

from biprm.scoring.aggregate import logit, sigmoid
from biprm.metrics.selection import (
    best_of,
    bon_at_n,
    bon_table,
    content_free,
    majority,
    noise_best_of,
    pass_any,
    random_pick,
    subsets,
    tie_share,
    vote,
)
from biprm.metrics.bootstrap import bootstrap_mean, paired_difference

# Three questions x four candidates, in pool order; scores are given as probabilities.
# q0: scores .2 .9 .5 .9 | correct F T F F | answers 1 2 1 3 | steps 1 2 3 4
# q1: scores .8 .1 .4 .95| correct F F T T | answers 5 5 7 7 | steps 2 2 5 5
# q2: scores .3 .7 .7 .1 | correct T T F T | answers 4 4 9 4 | steps 3 1 1 3
QID = np.repeat([0, 1, 2], 4)
SCORE = logit(np.array([0.2, 0.9, 0.5, 0.9, 0.8, 0.1, 0.4, 0.95, 0.3, 0.7, 0.7, 0.1]))  # solution logits
CORRECT = np.array([0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1], dtype=bool)
ANSWER = np.array(["1", "2", "1", "3", "5", "5", "7", "7", "4", "4", "9", "4"])
STEPS = np.array([1, 2, 3, 4, 2, 2, 5, 5, 3, 1, 1, 3])


def first(n):
    return subsets(QID, n, "first")


def test_best_of_breaks_ties_uniformly():
    # @2: q0 picks .9 (T), q1 .8 (F), q2 .7 (T)
    assert best_of(first(2), SCORE, CORRECT).tolist() == [1.0, 0.0, 1.0]
    # @4: q0 ties .9/.9 between T and F -> 1/2; q1 .95 (T); q2 ties .7/.7 between T and F -> 1/2
    assert best_of(first(4), SCORE, CORRECT).tolist() == [0.5, 1.0, 0.5]
    assert bon_at_n(QID, SCORE, CORRECT, 4) == pytest.approx(200 / 3)
    # a tie never goes to the first candidate: either order gives the same expected value
    assert bon_at_n([0, 0], [0.5, 0.5], [False, True], 2) == bon_at_n([0, 0], [0.5, 0.5], [True, False], 2) == 50.0


def test_random_pick_and_pass():
    assert random_pick(first(4), CORRECT).tolist() == [0.25, 0.5, 0.75]
    assert random_pick(first(1), CORRECT).tolist() == [0.0, 0.0, 1.0]
    assert pass_any(first(2), CORRECT).tolist() == [1.0, 0.0, 1.0]


def test_majority_with_fair_ties():
    # @2: q0 "1" vs "2" tie -> (F + T) / 2; q1 "5" twice (F); q2 "4" twice (T)
    assert majority(first(2), ANSWER, CORRECT).tolist() == [0.5, 0.0, 1.0]
    # @4: q0 "1" x2 wins (F); q1 "5" x2 vs "7" x2 tie -> 1/2; q2 "4" x3 (T)
    assert majority(first(4), ANSWER, CORRECT).tolist() == [0.0, 0.5, 1.0]


def test_weighted_vote():
    # @4: q0 "1" .7, "2" .9, "3" .9 -> "2" and "3" tie -> (T + F)
    # / 2; q1 "5" .9 vs "7" 1.35 (T); q2 "4" 1.1 vs "9" .7 (T)
    weights = sigmoid(SCORE)
    assert vote(first(4), ANSWER, weights, CORRECT) == pytest.approx([0.5, 1.0, 1.0])


def test_content_free_scorers():
    idx = first(4)
    base = content_free(idx, STEPS, CORRECT, ANSWER, "min", np.arange(13), draws=5)
    # fewest steps: q0 cand 0 (F); q1 cands 0, 1 tie (F, F); q2 cands 1, 2 tie (T, F) -> 1/2
    assert base["fewest steps"].tolist() == [0.0, 0.0, 0.5]
    # most steps: q0 cand 3 (F); q1 cands 2, 3 (T, T); q2 cands 0, 3 (T, T)
    assert base["most steps"].tolist() == [0.0, 1.0, 1.0]
    assert base["random pick"].tolist() == [0.25, 0.5, 0.75]
    # one step per candidate: i.i.d. noise is a uniform pick, whatever the aggregation
    noise = noise_best_of(idx, np.arange(13), CORRECT, "min", draws=4000, seed=1)
    assert noise == pytest.approx([0.25, 0.5, 0.75], abs=0.03)


def test_noise_under_min_prefers_short_solutions():
    # two candidates: 1 step (wrong) and 10 steps (right); the min of 10 normals is below one normal
    # with probability 10/11, so noise + min picks the short one about 10 times in 11
    offsets = np.array([0, 1, 11])
    value = noise_best_of(subsets(np.array([0, 0]), 2), offsets, np.array([False, True]), "min", draws=4000, seed=0)
    assert value[0] == pytest.approx(1 / 11, abs=0.02)


def test_random_protocol():
    # n = pool size: every subset is the whole pool
    assert best_of(subsets(QID, 4, "random", draws=7), SCORE, CORRECT).tolist() == [0.5, 1.0, 0.5]
    # n = 1: a uniform candidate; the expectation is the pool's share of correct ones
    assert random_pick(subsets(QID, 1, "random", draws=4000, seed=3), CORRECT) == pytest.approx(
        [0.25, 0.5, 0.75], abs=0.03
    )
    # unequal pools never draw past a question's pool: q1's two candidates are both wrong
    idx = subsets(QID[:6], 2, "random", draws=200)
    assert np.all(idx[:, 1] >= 4) and best_of(idx, SCORE[:6], CORRECT[:6])[1] == 0.0
    with pytest.raises(ValueError, match="protocol"):
        subsets(QID, 2, "last")


def test_table():
    t = bon_table(QID, SCORE, CORRECT, ANSWER, ns=(2, 4, 8))
    assert t["ns"] == [2, 4] and t["skipped"] == [8] and t["protocol"] == "first"
    assert t["bon"] == {2: pytest.approx(200 / 3), 4: pytest.approx(200 / 3)}
    assert t["mean"]["majority"] == pytest.approx((50 + 50) / 2)  # (1.5 / 3 + 1.5 / 3) / 2
    assert t["tie"] == {2: 0.0, 4: pytest.approx(200 / 3)}
    assert tie_share(first(4), SCORE).tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        bon_table(QID, SCORE, CORRECT, ANSWER, ns=(8, 16))


def test_bad_input():
    with pytest.raises(ValueError, match="exceeds"):
        bon_at_n(QID[:6], SCORE[:6], CORRECT[:6], 3)
    with pytest.raises(ValueError, match="contiguous"):
        bon_at_n([0, 0, 1, 0], [0.1, 0.2, 0.3, 0.4], [1, 0, 0, 1], 1)
    with pytest.raises(ValueError, match="NaN"):
        bon_at_n([0, 0], [np.nan, 0.1], [1, 0], 2)


def test_ranking_on_logits_keeps_what_probabilities_round_away():
    # sigmoid(40) and sigmoid(41) are both 1.0 in float64: ranked by logit, the second one wins
    assert tie_share(subsets(np.array([0, 0]), 2), np.array([40.0, 41.0])).tolist() == [0.0]
    assert bon_at_n([0, 0], [40.0, 41.0], [False, True], 2) == 100.0


def test_bootstrap_mean():
    # every question has the same value: no interval
    assert bootstrap_mean(np.full(20, 3.0)) == {"mean": 3.0, "low": 3.0, "high": 3.0}
    # 0/1 values: the interval of a proportion of 0.5 over 400 questions is about ±4.9 points
    v = np.r_[np.zeros(200), np.ones(200)]
    r = bootstrap_mean(v, resamples=4000, seed=0)
    assert (
        r["mean"] == 0.5 and r["low"] == pytest.approx(0.451, abs=0.01) and r["high"] == pytest.approx(0.549, abs=0.01)
    )
    # seeds are resampled too: two seeds that disagree widen the interval
    seeds = np.stack([np.zeros(50), np.ones(50)])
    r = bootstrap_mean(seeds, resamples=4000, seed=0)
    assert r["mean"] == 0.5 and r["low"] == 0.0 and r["high"] == 1.0


def test_paired_difference():
    a = np.r_[np.ones(30), np.zeros(10)]
    # the same values: a difference of exactly 0, within noise
    assert paired_difference(a, a) == {"mean": 0.0, "low": 0.0, "high": 0.0, "within_noise": True}
    # b wins nowhere and loses on 30 questions: a clear difference whose interval excludes 0
    d = paired_difference(a, np.zeros(40))
    assert d["mean"] == 0.75 and d["low"] > 0.5 and not d["within_noise"]
    # a single swapped question out of 40 is within noise
    b = a.copy()
    b[[0, 35]] = b[[35, 0]]
    assert paired_difference(a, b)["within_noise"]
    with pytest.raises(ValueError, match="same questions"):
        paired_difference(a, a[:5])


def test_auc_and_paired_win():
    from biprm.metrics.ranking import auc, paired_win

    # positives 3, 2 against negatives 1, 2: pairs (3>1) (3>2) (2>1) (2=2) -> 3.5 / 4
    assert auc([3, 2], [1, 2]) == 87.5
    assert auc([1], [1]) == 50.0 and np.isnan(auc([], [1]))
    assert paired_win([2, 1, 1], [1, 1, 2]).tolist() == [1.0, 0.5, 0.0]
    assert np.isnan(paired_win([np.nan], [1.0])[0])  # a step that was not scored is not a loss


def test_bootstrap_statistic():
    from biprm.metrics.bootstrap import bootstrap_statistic

    values = np.arange(10.0)
    r = bootstrap_statistic(lambda i: float(values[i].max()), 10, resamples=500)
    assert r["mean"] == 9.0 and r["high"] == 9.0 and r["low"] < 9.0


def test_clustered_means_and_paired_differences_draw_whole_questions_alike():
    """Pools 0 and 1 share a question: a draw takes both or neither. The mean's interval equals one drawn by hand, and a
    difference of two scorers uses the same draws for both sides."""
    clusters = np.array([0, 0, 1, 2, 3])
    a, b = np.array([1.0, 1.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 0.0, 0.0, 0.0])
    draws = np.random.default_rng(3).integers(4, size=(500, 4))
    rows = [np.concatenate([np.flatnonzero(clusters == c) for c in drawn]) for drawn in draws]
    hand = np.quantile([a[r].mean() for r in rows], [0.025, 0.975])
    mean = bootstrap_mean(a, resamples=500, seed=3, clusters=clusters)
    assert [mean["low"], mean["high"]] == pytest.approx(hand) and mean["mean"] == pytest.approx(0.6)
    hand = np.quantile([a[r].mean() - b[r].mean() for r in rows], [0.025, 0.975])
    diff = paired_difference(a, b, resamples=500, seed=3, clusters=clusters)
    assert [diff["low"], diff["high"]] == pytest.approx(hand)
