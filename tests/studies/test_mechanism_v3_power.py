"""Amended version 3's power from variance components (studies/mechanism/v3_power.py), on hand-computed cases."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from studies.mechanism import v3_power

ROOT = Path(__file__).resolve().parents[2] / "studies" / "mechanism"


def test_components_of_a_two_by_two_array_by_hand():
    # seed means 1, 5 (effects ±2, variance 8), question means 2, 4 (±1, variance 2), nothing left over
    assert v3_power.components(np.array([[0.0, 2.0], [4.0, 6.0]])) == {"seed": 8.0, "question": 2.0, "residual": 0.0}
    # the same means with ±1 left in each cell: mean squares 16 (seeds), 4 (questions), 4 (residual)
    assert v3_power.components(np.array([[1.0, 1.0], [3.0, 7.0]])) == {"seed": 6.0, "question": 0.0, "residual": 4.0}
    with pytest.raises(ValueError, match="at least 2 seeds"):
        v3_power.components(np.zeros((1, 5)))


def test_power_and_seeds_needed_by_hand():
    c = {"seed": 6.0, "question": 0.0, "residual": 4.0}
    assert v3_power.standard_error(c, 2, 2) == pytest.approx(2.0)  # √(6/2 + 0/2 + 4/4)
    # Φ(4.5 / 2 − 1.96) = Φ(0.29)
    assert v3_power.power(c, 2, 2, true=9.0, margin=4.5, level=0.95) == pytest.approx(0.6141, abs=1e-4)
    # the same chance to be contradicted at a true 0: the margin is halfway
    assert v3_power.power(c, 2, 2, true=0.0, margin=4.5, level=0.95) == pytest.approx(0.6141, abs=1e-4)
    # standard error √(8 / S) at 2 questions: S = 3 gives 78.7 %, S = 4 gives 88.9 %
    assert v3_power.seeds_needed(c, 2, 9.0, 4.5, 0.95) == 4
    # seeds cannot shrink a question part: a standard error of at least √(1000 / 10) = 10 stays
    assert v3_power.seeds_needed({"seed": 0.0, "question": 1000.0, "residual": 0.0}, 10, 9.0, 4.5, 0.95) is None


def test_statistic_components_count_the_question_part_once():
    c = v3_power.statistic_components(np.array([0.1, 0.5, 0.9]), question_variance=0.01, questions=100)
    assert c == pytest.approx({"seed": 0.15, "question": 1.0, "residual": 0.0})  # 0.16 − 0.01; 0.01 × 100
    assert v3_power.standard_error(c, 3, 100) == pytest.approx(np.sqrt(0.05 + 0.01))


def test_the_committed_power_is_the_amended_designs():
    """results/v3_power.json was written from the amended design's file as committed."""
    design = yaml.safe_load((ROOT / "v3_amended.yaml").read_text())
    power = json.loads((ROOT / "results" / "v3_power.json").read_text())
    assert power["planned"]["seeds"] == design["seeds"][design["verdict_arm"]] and power["level"] == design["level"]
    for key, p in power["power"][design["verdict_arm"]].items():
        assert (p["effect"], p["margin"]) == (design["power_at"][key][0], design["margins"][key])
        c = power["components"][design["verdict_arm"]][key]
        assert p["power"] == pytest.approx(
            v3_power.power(
                c, power["planned"]["seeds"], power["planned"]["questions"], p["effect"], p["margin"], power["level"]
            )
        )
