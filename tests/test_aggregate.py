"""Solution scores from step scores, by hand."""
import numpy as np
import pytest

from biprm.aggregate import aggregate
from biprm.scores import StepScores, step_positions

# trajectory 0: [0.9, 0.2, 0.8]; trajectory 1: [0.5]; trajectory 2: [0.6, 0.7]
VALUES = np.array([0.9, 0.2, 0.8, 0.5, 0.6, 0.7])
OFFSETS = np.array([0, 3, 4, 6])


@pytest.mark.parametrize(
    "how, expected",
    [
        ("min", [0.2, 0.5, 0.6]),
        ("max", [0.9, 0.5, 0.7]),
        ("mean", [(0.9 + 0.2 + 0.8) / 3, 0.5, 0.65]),
        ("prod", [0.9 * 0.2 * 0.8, 0.5, 0.42]),
        ("last", [0.8, 0.5, 0.7]),
    ],
)
def test_aggregations_by_hand(how, expected):
    np.testing.assert_allclose(aggregate(VALUES, OFFSETS, how), expected)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(VALUES, OFFSETS, "median")
    with pytest.raises(ValueError, match="at least one step"):
        aggregate(VALUES, np.array([0, 3, 3, 6]), "min")


def test_step_scores_select_and_positions():
    scores = StepScores(OFFSETS, VALUES, sigma=VALUES * 0)
    np.testing.assert_array_equal(step_positions(OFFSETS, [2, 0]), [4, 5, 0, 1, 2])
    sub = scores.select([2, 0])
    np.testing.assert_array_equal(sub.offsets, [0, 2, 5])
    np.testing.assert_allclose(sub.fused, [0.6, 0.7, 0.9, 0.2, 0.8])
    np.testing.assert_allclose(sub.solution_scores("min"), [0.6, 0.2])
    assert sub.l2r is None and len(sub.sigma) == 5
