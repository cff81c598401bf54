"""Solution scores from step scores, by hand."""

import numpy as np
import pytest

from biprm.scoring.aggregate import aggregate, log_sigmoid, logit, mean_of_probabilities, sigmoid

# step probabilities: trajectory 0: [0.9, 0.2, 0.8]; trajectory 1: [0.5]; trajectory 2: [0.6, 0.7]
VALUES = np.array([0.9, 0.2, 0.8, 0.5, 0.6, 0.7])
LOGITS = logit(VALUES)
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
    """The operators are defined on probabilities; aggregate returns the logit of the result."""
    np.testing.assert_allclose(sigmoid(aggregate(LOGITS, OFFSETS, how)), expected, rtol=1e-12)
    np.testing.assert_allclose(aggregate(LOGITS, OFFSETS, how), logit(np.array(expected)), rtol=1e-9)


def test_logit_space_keeps_orderings_that_probabilities_lose():
    # three steps at logit 40 vs at 41: every probability and product rounds to 1.0 in float64
    x = np.array([40.0, 40.0, 40.0, 41.0, 41.0, 41.0])
    offsets = np.array([0, 3, 6])
    assert sigmoid(np.array([40.0, 41.0])).tolist() == [1.0, 1.0]
    for how in ("min", "max", "last", "mean", "prod"):
        low, high = aggregate(x, offsets, how)
        assert np.isfinite(low) and low < high, how
    # prod of three probabilities 1 - e^-40 is about 1 - 3e^-40: its logit is about 40 - log 3
    assert aggregate(x[:3], offsets[:2], "prod")[0] == pytest.approx(40 - np.log(3), abs=1e-9)
    assert aggregate(x[:3], offsets[:2], "mean")[0] == pytest.approx(40.0, abs=1e-9)


def test_log_sigmoid_and_sigmoid_at_extremes():
    assert log_sigmoid(np.array([-800.0]))[0] == -800.0 and log_sigmoid(np.array([800.0]))[0] == 0.0
    np.testing.assert_allclose(
        sigmoid(np.array([-40.0, 0.0, 2.0])),
        [np.exp(-40.0) / (1 + np.exp(-40.0)), 0.5, 1 / (1 + np.exp(-2.0))],
        rtol=1e-14,
    )
    assert logit(np.array([0.0, 1.0])).tolist() == [-np.inf, np.inf]


def test_mean_of_probabilities_is_the_ensembles_mean():
    a, b = logit(np.array([0.2, 0.9])), logit(np.array([0.6, 0.5]))
    np.testing.assert_allclose(sigmoid(mean_of_probabilities([a, b])), [0.4, 0.7], rtol=1e-12)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(VALUES, OFFSETS, "median")
    with pytest.raises(ValueError, match="at least one step"):
        aggregate(VALUES, np.array([0, 3, 3, 6]), "min")
    with pytest.raises(ValueError, match=r"offsets must run from 0 to len\(values\)=6"):  # steps no trajectory owns
        aggregate(VALUES, np.array([0, 3, 4]), "min")
