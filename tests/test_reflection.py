"""Long synthetic traces with reflection passages (biprm.data.reflection): labels by hand on one problem."""

import json
import random

import pytest

from biprm.data.readers import load_trajectories
from biprm.data.reflection import make_reflective_dataset, make_reflective_solution, processbench_rows
from biprm.data.synthetic import make_problem


@pytest.fixture
def problem():
    """Ava has 42 books; * 4 = 168, / 4 = 42, + 40 = 82."""
    p = make_problem(random.Random(3), (3, 3))
    assert (p.start, p.values) == (42, [168, 42, 82])
    return p


def test_a_fixed_slip_is_the_first_error_and_the_solution_recovers(problem):
    t = make_reflective_solution(problem, random.Random(5), "fixed", reflect=0.6, bare_slip=0.0)
    assert t.steps[3:] == [
        "She finds 40 more books, so she has 42 + 40 = 72 books.",
        "Wait, let me re-check step 3: 42 + 40 = 82, not 72. So she has 82 books, and I go on from 82.",
        "The answer is 82.",
    ]
    assert t.steps[2] == "Hmm, let me verify the books after step 2: 168 / 4 = 42. Yes, 42 is right."
    assert t.labels == [1, 1, 1, 0, 1, 1] and t.meta["first_error"] == 3 and t.correct


def test_a_slip_never_fixed_is_zero_from_its_step_on(problem):
    t = make_reflective_solution(problem, random.Random(5), "slip", reflect=0.6, bare_slip=0.0)
    assert t.steps[3:] == [
        "She finds 40 more books, so she has 42 + 40 = 72 books.",
        "Wait, let me re-check the books after step 1: 42 * 4 = 168. Yes, 168 is right.",
        "The answer is 72.",
    ]
    assert t.labels == [1, 1, 1, 0, 0, 0] and t.meta["first_error"] == 3 and not t.correct
    right = make_reflective_solution(problem, random.Random(5), "correct", reflect=0.0)
    assert right.labels == [1.0] * 4 and right.meta["first_error"] == -1 and right.steps[-1] == "The answer is 82."
    with pytest.raises(ValueError, match="unknown kind 'typo'"):
        make_reflective_solution(problem, random.Random(5), "typo")


def test_every_slip_is_fixed_or_carried_and_the_rows_read_as_processbench(tmp_path):
    trajs = make_reflective_dataset(300, seed=1)
    for t in trajs:
        first = t.meta["first_error"]
        assert (first == -1) == (t.meta["kind"] == "correct") and t.correct == (t.meta["kind"] != "slip")
        if t.meta["kind"] == "fixed":
            assert t.labels[first] == 0 and sum(t.labels) == len(t.labels) - 1 and "not" in t.steps[first + 1]
        if t.meta["kind"] == "slip":
            assert t.labels == [1.0] * first + [0.0] * (len(t.labels) - first)
    assert sum("Wait" in s or "Hmm" in s or "Let me" in s for t in trajs for s in t.steps) > len(
        trajs
    )  # padded with passages
    path = tmp_path / "reflective.json"
    path.write_text(json.dumps(processbench_rows(trajs)))
    back = load_trajectories(str(path), fmt="processbench")
    assert [b.meta["first_error"] for b in back] == [t.meta["first_error"] for t in trajs] and back[0].steps == trajs[
        0
    ].steps
