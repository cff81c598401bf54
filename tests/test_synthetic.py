import random
import re
import time
from collections import Counter

import numpy as np
import pytest

from biprm.data.synthetic import KINDS, make_bon_pools, make_dataset, make_problem, make_solution
from biprm.data.trajectory import Trajectory, labels_from_first_error, validate

EQUATION = re.compile(r"so (?:he|she) has (\d+) ([-+*/]) (\d+) = (\d+) \w+\.$")
CLAIM = re.compile(r"so now (?:he|she) has (\d+) \w+\.$")
ANSWER = re.compile(r"The answer is (\d+)\.$")
OPS = {"+": lambda a, n: a + n, "-": lambda a, n: a - n, "*": lambda a, n: a * n, "/": lambda a, n: a / n}


def parse(traj: Trajectory) -> tuple[list[tuple], int]:
    """(a, op, n, c) per equation step or (c,) per bare claim, and the stated final answer."""
    *events, last = traj.steps
    parsed = []
    for step in events:
        m = EQUATION.search(step) or CLAIM.search(step)
        assert m, step
        g = m.groups()
        parsed.append((int(g[0]), g[1], int(g[2]), int(g[3])) if len(g) == 4 else (int(g[0]),))
    return parsed, int(ANSWER.fullmatch(last).group(1))


def stated(event: tuple) -> int:
    return event[-1]


def right(event: tuple) -> bool:
    return len(event) == 1 or OPS[event[1]](event[0], event[2]) == event[3]


@pytest.fixture(scope="module")
def data() -> list[Trajectory]:
    return make_dataset(3000, seed=7)


def test_deterministic():
    assert make_dataset(300, seed=1) == make_dataset(300, seed=1)
    assert make_dataset(300, seed=1) != make_dataset(300, seed=2)
    assert make_bon_pools(5, 8, seed=3) == make_bon_pools(5, 8, seed=3)
    state = random.getstate()
    make_dataset(50, seed=0)
    assert random.getstate() == state  # never touches the global RNG


def test_shape_labels_and_text(data):
    assert Counter(t.meta["kind"] for t in data).keys() == set(KINDS)
    for i, t in enumerate(data):
        validate(t, f"synthetic {i}")
        assert 3 <= len(t.steps) <= 7 and t.meta["qid"] == i
        if t.meta["kind"] == "claim":  # the solution recovers: only the claim's own step is wrong
            assert t.labels == [0.0 if k == t.meta["first_error"] else 1.0 for k in range(len(t.steps))]
        else:
            assert t.labels == labels_from_first_error(t.meta["first_error"], len(t.steps))
        assert t.first_error == t.meta["first_error"]
        assert (t.meta["first_error"] == -1) == (t.meta["kind"] == "correct")
        assert t.question.isascii() and all(s.isascii() for s in t.steps)
        assert all(int(x) < 1000 for x in re.findall(r"\d+", " ".join([t.question, *t.steps])))
        events, final = parse(t)
        assert t.correct == (str(final) == t.answer) and final == stated(events[-1])


def test_correct_solutions_are_consistent(data):
    for t in (t for t in data if t.meta["kind"] == "correct"):
        events, final = parse(t)
        assert all(map(right, events)) and t.correct
        assert all(len(e) == 1 or e[0] == stated(p) for p, e in zip(events, events[1:]))


def test_calc_error_is_built_on(data):
    calc = [t for t in data if t.meta["kind"] == "calc"]
    for t in calc:
        k = t.meta["first_error"]
        events, final = parse(t)
        assert len(events[k]) == 4 and not right(events[k])  # the wrong equation itself
        assert all(map(right, events[:k])) and all(map(right, events[k + 1 :]))
        assert all(
            len(e) == 1 or e[0] == stated(p) for p, e in zip(events[k:], events[k + 1 :])
        )  # later steps use the wrong value
        assert not t.correct
    assert len(calc) > 500


def test_claim_error_is_exposed_by_the_next_step(data):
    claims = [t for t in data if t.meta["kind"] == "claim"]
    for t in claims:
        k = t.meta["first_error"]
        events, final = parse(t)
        assert k < len(events) - 1 and len(events[k]) == 1 and len(events[k + 1]) == 4
        true_value = events[k + 1][0]
        assert true_value != stated(events[k]) and right(events[k + 1])
        assert t.correct and str(final) == t.answer
    rng = random.Random(5)
    for _ in range(200):
        problem = make_problem(rng)
        t = make_solution(problem, rng, "claim")
        k = t.first_error
        events, _ = parse(t)
        assert events[k + 1][0] == problem.values[k] != stated(events[k])


def test_error_positions_cover_the_chain(data):
    for kind in ("calc", "claim"):
        positions = [(t.meta["first_error"], len(t.steps)) for t in data if t.meta["kind"] == kind]
        assert any(k == 0 for k, _ in positions)
        last = 2 if kind == "calc" else 3  # a claim needs a following equation step
        assert any(k == n - last and n == 7 for k, n in positions)
        relative = [k / (n - 1) for k, n in positions]
        assert min(relative) == 0 and max(relative) > 0.6


def test_bon_pools():
    pools = make_bon_pools(40, 16, seed=0)
    assert len(pools) == 640
    assert [t.meta["cand"] for t in pools[:16]] == list(range(16)) and {t.meta["qid"] for t in pools[-16:]} == {39}
    for q in range(40):
        group = pools[16 * q : 16 * q + 16]
        assert len({t.question for t in group}) == 1 and len({t.answer for t in group}) == 1
        assert all(t.correct == (parse(t)[1] == int(t.answer)) for t in group)
    share = Counter(sum(t.correct for t in pools[16 * q : 16 * q + 16]) for q in range(40))
    assert len(share) > 5  # the share of right candidates varies between questions
    with pytest.raises(ValueError, match="unknown kind"):
        make_solution(make_problem(random.Random(0)), random.Random(0), "typo")


def test_fast():
    start = time.process_time()
    make_dataset(10_000, seed=0)
    assert time.process_time() - start < 3.0


def test_bon_pools_with_few_right_answers_leave_random_pick_far_from_the_ceiling():
    # the demo's pools: at most half right, the errors mostly calc (a claim's answer is right)
    pools = make_bon_pools(200, 16, seed=0, errors=(0.7, 0.3), correct_share=(0.0, 0.5))
    right = np.array([t.correct for t in pools]).reshape(200, 16)
    assert 0.4 < right.mean() < 0.55 and right.any(1).mean() > 0.9  # random pick about half, pass@16 above 90 %
