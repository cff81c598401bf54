import numpy as np
import pytest

from biprm.aggregate import logit
from biprm.metrics.bon import (
    bon_at_n,
    bon_random_subsets,
    bon_table,
    majority_vote_at_n,
    pass_at_n,
    random_pick_at_n,
    tie_rate_at_n,
    weighted_vote_at_n,
)

# Three questions x four candidates, in pool order; scores are given as probabilities.
# q0: scores .2 .9 .5 .9 | correct F T F F | answers 1 2 1 3
# q1: scores .8 .1 .4 .95| correct F F T T | answers 5 5 7 7
# q2: scores .3 .7 .7 .1 | correct T T F T | answers 4 4 9 4
QID = np.repeat([0, 1, 2], 4)
SCORE = logit(np.array([0.2, 0.9, 0.5, 0.9, 0.8, 0.1, 0.4, 0.95, 0.3, 0.7, 0.7, 0.1]))  # solution logits
CORRECT = np.array([0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1], dtype=bool)
ANSWER = np.array(["1", "2", "1", "3", "5", "5", "7", "7", "4", "4", "9", "4"])


def test_bon():
    # @2: q0 picks .9 (T), q1 picks .8 (F), q2 picks .7 (T) -> 2/3
    assert bon_at_n(QID, SCORE, CORRECT, 2) == pytest.approx(200 / 3)
    # @4: q0 ties .9/.9 -> earliest (cand 1, T); q1 picks .95 (T); q2 ties .7/.7 -> cand 1 (T) -> 3/3
    assert bon_at_n(QID, SCORE, CORRECT, 4) == 100.0


def test_bon_tie_goes_to_earliest():
    # both score .5; the first is wrong, so a tie-break toward the earliest gives 0 %
    assert bon_at_n([0, 0], [0.5, 0.5], [False, True], 2) == 0.0
    assert bon_at_n([0, 0], [0.5, 0.5], [True, False], 2) == 100.0


def test_pass():
    # @2: q0 T, q1 F (F F), q2 T -> 2/3; @4: all have a correct candidate
    assert pass_at_n(QID, CORRECT, 2) == pytest.approx(200 / 3)
    assert pass_at_n(QID, CORRECT, 4) == 100.0


def test_random_pick_is_the_mean_correctness_of_the_first_n():
    # @2: q0 (F T) 1/2, q1 (F F) 0, q2 (T T) 1 -> mean 1/2; @4: q0 1/4, q1 2/4, q2 3/4 -> 1/2
    assert random_pick_at_n(QID, CORRECT, 2) == pytest.approx(50.0)
    assert random_pick_at_n(QID, CORRECT, 4) == pytest.approx(50.0)
    # @1: q0 F, q1 F, q2 T -> 1/3
    assert random_pick_at_n(QID, CORRECT, 1) == pytest.approx(100 / 3)
    assert bon_table(QID, SCORE, CORRECT, ANSWER, (1, 2))["chance"] == {1: pytest.approx(100 / 3), 2: pytest.approx(50.0)}


def test_majority():
    # @2: q0 "1" vs "2" tie -> "1" seen first (F); q1 "5" (F); q2 "4" (T) -> 1/3
    assert majority_vote_at_n(QID, ANSWER, CORRECT, 2) == pytest.approx(100 / 3)
    # @4: q0 "1" x2 (F); q1 "5" x2 vs "7" x2 -> "5" first (F); q2 "4" x3 (T) -> 1/3
    assert majority_vote_at_n(QID, ANSWER, CORRECT, 4) == pytest.approx(100 / 3)


def test_weighted():
    # @2: q0 "1" .2 vs "2" .9 -> "2" (T); q1 "5" .9 (F); q2 "4" 1.0 (T) -> 2/3
    assert weighted_vote_at_n(QID, ANSWER, SCORE, CORRECT, 2) == pytest.approx(200 / 3)
    # @4: q0 "1" .7, "2" .9, "3" .9 -> tie, "2" first (T); q1 "5" .9 vs "7" 1.35 (T);
    #     q2 "4" 1.1 vs "9" .7 (T) -> 3/3
    assert weighted_vote_at_n(QID, ANSWER, SCORE, CORRECT, 4) == 100.0


def test_unequal_pools_and_too_large_n():
    # q0 has 4 candidates, q1 only 2: @2 q0 picks .9 (T), q1 picks .8 (F)
    qid, score, correct = QID[:6], SCORE[:6], CORRECT[:6]
    assert bon_at_n(qid, score, correct, 2) == 50.0
    with pytest.raises(ValueError, match="n=3"):
        bon_at_n(qid, score, correct, 3)
    with pytest.raises(ValueError):
        pass_at_n(QID, CORRECT, 5)


def test_non_contiguous_qid_and_nan_rejected():
    with pytest.raises(ValueError, match="contiguous"):
        bon_at_n([0, 0, 1, 0], [0.1, 0.2, 0.3, 0.4], [1, 0, 0, 1], 1)
    with pytest.raises(ValueError, match="NaN"):
        bon_at_n([0, 0], [np.nan, 0.1], [1, 0], 2)


def test_table():
    t = bon_table(QID, SCORE, CORRECT, ANSWER, ns=(2, 4, 8))
    assert t["ns"] == [2, 4] and t["skipped"] == [8]
    assert t["bon"] == {2: pytest.approx(200 / 3), 4: 100.0}
    assert t["mean"]["bon"] == pytest.approx(250 / 3)  # (66.67 + 100) / 2
    assert t["mean"]["pass"] == pytest.approx(250 / 3)
    assert t["mean"]["majority"] == pytest.approx(100 / 3)
    assert t["mean"]["weighted"] == pytest.approx(250 / 3)
    with pytest.raises(ValueError):
        bon_table(QID, SCORE, CORRECT, ANSWER, ns=(8, 16))


def test_random_subsets():
    # n = pool size: every draw is the whole pool, so no spread
    assert bon_random_subsets(QID, SCORE, CORRECT, 4, repeats=5, seed=0) == (100.0, 100.0, 100.0)
    # n = 1: a random candidate; expected accuracy is the mean of 1/4, 2/4, 3/4 = 50 %
    mean, low, high = bon_random_subsets(QID, SCORE, CORRECT, 1, repeats=2000, seed=3)
    assert mean == pytest.approx(50.0, abs=2.0)
    assert low <= mean <= high and low < high
    assert bon_random_subsets(QID, SCORE, CORRECT, 2, 50, seed=1) == bon_random_subsets(QID, SCORE, CORRECT, 2, 50, seed=1)


def test_random_subsets_unequal_pools_never_draw_padding():
    # q1 has 2 candidates, both wrong: any draw must score 0 on it, so at most 50 %
    qid, score, correct = QID[:6], SCORE[:6], CORRECT[:6]
    mean, low, high = bon_random_subsets(qid, score, correct, 2, repeats=200, seed=0)
    assert high <= 50.0 and mean > 0.0


def test_tie_rate():
    # @2: no question ties (q2's .3/.7 differ); @4: q0 (.9/.9) and q2 (.7/.7) tie at the top -> 2/3
    assert tie_rate_at_n(QID, SCORE, 2) == 0.0
    assert tie_rate_at_n(QID, SCORE, 4) == pytest.approx(200 / 3)
    assert bon_table(QID, SCORE, CORRECT, ANSWER, ns=(2, 4))["tie"] == {2: 0.0, 4: pytest.approx(200 / 3)}


def test_ranking_on_logits_keeps_what_probabilities_round_away():
    # sigmoid(40) and sigmoid(41) are both 1.0 in float64: ranked by probability, q0 would tie and pick
    # the wrong first candidate; ranked by logit, the second one wins
    assert tie_rate_at_n([0, 0], [40.0, 41.0], 2) == 0.0
    assert bon_at_n([0, 0], [40.0, 41.0], [False, True], 2) == 100.0
