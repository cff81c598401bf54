"""The scripted synthetic-task policy: its error rates, what each error does to the answer, determinism, the CLI."""

import json

import numpy as np
import pytest

from biprm.cli import main
from biprm.data.synthetic import apply_op, make_problems
from biprm.evaluation.grading import extract_answer, grade_many
from biprm.search.algorithms import Search, sample
from biprm.search.config import SearchConfig
from biprm.search.synthetic import SyntheticPolicy, replay

PROBLEMS = make_problems(300, seed=5)


def kinds(problem, steps: list[str]) -> list[str]:
    """Each event step as "calc" (a wrong equation), "claim" (a bare wrong value) or "correct", judged from the
    value it should have built on."""
    out, carried = [], problem.start
    for t, step in enumerate(steps[: len(problem.ops)]):
        op, n = problem.ops[t]
        stated, right = int(step.split()[-2]), apply_op(op, carried, n)
        out.append("correct" if stated == right else "calc" if "=" in step else "claim")
        carried = stated if "=" in step else right
    return out


def solve(policy, problems, n: int = 1):
    return sample(Search([p.question for p in problems], policy, None, max_depth=12), n)


def test_error_rates_match_the_asked_rates():
    policy = SyntheticPolicy(PROBLEMS, calc_rate=0.2, claim_rate=0.1, seed=1)
    paths = solve(policy, PROBLEMS, 8)
    drawn = {"calc": 0, "claim": 0, "claimable": 0, "steps": 0}
    for p in paths:
        problem = PROBLEMS[p.q]
        seen = kinds(problem, list(p.steps))
        for t, kind in enumerate(seen):
            drawn["steps"] += 1
            drawn[kind] = drawn.get(kind, 0) + 1
            # a claim needs a later event step to contradict it, and is never drawn right after a claim
            drawn["claimable"] += t + 1 < len(problem.ops) and (t == 0 or seen[t - 1] != "claim")
    calc, claim = drawn["calc"] / drawn["steps"], drawn["claim"] / drawn["claimable"]
    assert drawn["steps"] > 8000
    assert abs(calc - 0.2) < 4 * np.sqrt(0.2 * 0.8 / drawn["steps"]), calc
    assert abs(claim - 0.1) < 4 * np.sqrt(0.1 * 0.9 / drawn["claimable"]), claim


def graded(paths, problems) -> list[bool]:
    return grade_many([(str(problems[p.q].answer), extract_answer("\n".join(p.steps))) for p in paths], workers=0)


def test_a_calc_slip_ends_wrong_and_a_claim_recovers():
    problems = PROBLEMS[:60]
    slips = solve(SyntheticPolicy(problems, calc_rate=1.0, claim_rate=0.0), problems, 2)
    assert all(p.finished and p.steps[-1].startswith("The answer is") for p in slips)
    assert not any(graded(slips, problems))
    claims = solve(SyntheticPolicy(problems, calc_rate=0.0, claim_rate=0.5, seed=3), problems, 2)
    assert all(graded(claims, problems))
    found = 0
    for p in claims:
        problem, steps = problems[p.q], list(p.steps)
        for t, kind in enumerate(kinds(problem, steps)):
            if kind == "claim":  # the next step shows the equation on the true value, contradicting the claim
                found += 1
                assert t + 1 < len(problem.ops) and f"has {problem.values[t]} " in steps[t + 1] and "=" in steps[t + 1]
        assert replay(problem, steps[: len(problem.ops)])[0] == problem.answer
    assert found > 30


def test_draws_depend_on_seed_question_and_prefix_only():
    a, b = SyntheticPolicy(PROBLEMS, 0.3, 0.3, seed=7), SyntheticPolicy(PROBLEMS, 0.3, 0.3, seed=7)
    first = [p.steps for p in solve(a, PROBLEMS[:20], 4)]
    assert [p.steps for p in solve(b, PROBLEMS[:20], 4)] == first
    assert [p.steps for p in solve(a, PROBLEMS[:20], 4)] != first  # asked again: the next draws
    a.reseed(123)  # a batch draws the same whatever ran before it
    assert [p.steps for p in solve(a, PROBLEMS[10:20], 4)] == first[40:]
    assert [p.steps for p in solve(SyntheticPolicy(PROBLEMS, 0.3, 0.3, seed=8), PROBLEMS[:20], 4)] != first
    assert len(set(first[:4])) > 1  # the n children of one prefix differ


def test_a_policy_restored_from_its_saved_state_draws_what_it_would_have():
    a = SyntheticPolicy(PROBLEMS, 0.3, 0.3, seed=7)
    solve(a, PROBLEMS[:10], 4)
    saved = json.loads(json.dumps(a.state()))  # as a batch's checkpoint keeps it
    then = [p.steps for p in solve(a, PROBLEMS[:10], 4)]
    b = SyntheticPolicy(PROBLEMS, 0.3, 0.3, seed=7)
    b.restore(saved)
    assert [p.steps for p in solve(b, PROBLEMS[:10], 4)] == then


def test_a_question_the_policy_does_not_know_is_refused():
    policy = SyntheticPolicy(PROBLEMS[:2], 0.2, 0.2)
    with pytest.raises(ValueError, match="no problem behind the question 'Tom has 3 apples"):
        policy.generate_step([policy.prompt("Tom has 3 apples.", [])], 1)
    with pytest.raises(ValueError, match="step 1 'I think so.' is not an event step"):
        policy.generate_step([policy.prompt(PROBLEMS[0].question, ["I think so."])], 1)
    with pytest.raises(ValueError, match="--policy synthetic .* needs --data synthetic"):
        SearchConfig(out="x", data="gsm8k", policy="synthetic")


def test_the_cli_runs_the_synthetic_policy_on_the_synthetic_questions(tmp_path, capsys):
    out = tmp_path / "out"
    main(
        [
            "search",
            "--out",
            str(out),
            "--data",
            "synthetic:6:42",
            "--policy",
            "synthetic",
            "--calc-rate",
            "0.3",
            "--claim-rate",
            "0.1",
            "--prm",
            "noise",
            "--algorithms",
            "bon",
            "beam",
            "--n",
            "2",
            "4",
            "--width",
            "2",
            "--grade-workers",
            "0",
        ]
    )
    rows = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    problems = make_problems(6, seed=42)
    assert [(r["question"], r["gold"]) for r in rows] == [(p.question, str(p.answer)) for p in problems]
    assert all(r["pool"][0]["steps"][-1] == f"The answer is {r['pool'][0]['answer']}." for r in rows)
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["policy"], settings["calc_rate"], settings["claim_rate"]) == ("synthetic", 0.3, 0.1)
    assert "majority@4" in capsys.readouterr().out


def test_a_malformed_synthetic_spec_is_one_line_naming_it():
    from biprm.data.readers import synthetic_spec

    assert synthetic_spec("synthetic:12:3") == (12, 3) and synthetic_spec("gsm8k") is None
    for bad in ("synthetic:abc", "synthetic:10:x", "synthetic:1:2:3"):
        with pytest.raises(ValueError, match=f"data '{bad}': the synthetic task is written synthetic"):
            synthetic_spec(bad)
