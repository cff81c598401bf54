"""Long synthetic traces with reflection passages: the synthetic task's solutions, padded with "Wait, let me re-check"
passages that re-derive earlier values, some of which fix the slip just before them (docs/EVALUATION.md, issue 45).

Each passage is a step of its own. Three kinds of solution:

- "correct": every step right; passages re-derive earlier values and confirm them (label 1).
- "fixed": a slip at event k (a wrong result, written as an equation or as a bare claim), then at once a passage that
  re-derives event k, names the slip and states the right value, which every later step builds on. The answer is right.
- "slip": the same slip, never fixed: later steps build on it and the answer is wrong.

Labels follow ProcessBench's rule, a step judged as written: the slip is the first error of both "fixed" and "slip"
(meta["first_error"] = its index), and it stays 0 though a later passage fixes it. After a fixed slip the solution has
recovered, so the fix and every later step are 1 (as the synthetic task labels a wrong claim); after a slip that is
never fixed every later step is 0. The evidence that a bare slip was wrong sits only in the passage after it.
"""

from __future__ import annotations

import random

from biprm.data.synthetic import Problem, calc_slip, make_problem, write_step
from biprm.data.trajectory import Trajectory

KINDS = ("correct", "fixed", "slip")
OPENERS = ("Wait, let me re-check", "Hmm, let me verify", "Wait, let me double-check", "Let me check again")


def recheck(problem: Problem, t: int, a: int, c: int, opener: str) -> str:
    """A passage that re-derives event t's result from the value before it, and confirms it."""
    op, n = problem.ops[t]
    return f"{opener} the {problem.item} after step {t + 1}: {a} {op} {n} = {c}. Yes, {c} is right."


def fix(problem: Problem, t: int, a: int, wrong: int, opener: str) -> str:
    """A passage that re-derives event t's result, names the slip and states the right value."""
    op, n = problem.ops[t]
    right = problem.values[t]
    return (
        f"{opener} step {t + 1}: {a} {op} {n} = {right}, not {wrong}. So {problem.pronoun} has {right} {problem.item}, "
        f"and I go on from {right}."
    )


def make_reflective_solution(
    problem: Problem, rng: random.Random, kind: str, reflect: float = 0.5, bare_slip: float = 0.5
) -> Trajectory:
    """A labelled solution of `kind` (KINDS) with a re-check passage after each event with chance `reflect` (re-deriving
    an earlier, right value); a slip is written as a bare claim with chance `bare_slip`."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {KINDS}")
    n_events = len(problem.ops)
    operands, stated = [problem.start, *problem.values[:-1]], list(problem.values)
    k = -1
    if kind != "correct":
        for k in rng.sample(range(n_events), n_events):  # a slip that keeps the later values in range
            if (chain := calc_slip(problem, k, problem.values[k], rng)) is not None:
                break
        if kind == "fixed":
            stated[k] = chain[0]
        else:
            stated[k:], operands[k + 1 :] = chain, chain[:-1]
    steps, labels, first = [], [], -1
    for t in range(n_events):
        slipped = t == k
        steps.append(write_step(problem, t, operands[t], stated[t], bare=slipped and rng.random() < bare_slip))
        if slipped:
            first = len(steps) - 1
        labels.append(0.0 if slipped or (kind == "slip" and k < t) else 1.0)
        if slipped and kind == "fixed":
            steps.append(fix(problem, t, operands[t], stated[t], rng.choice(OPENERS)))
            labels.append(1.0)
        elif rng.random() < reflect:
            right = [j for j in range(t + 1) if j < k or k < 0 or kind == "fixed"]  # a value the solution holds right
            j = rng.choice(right) if right else None
            if j is not None:
                steps.append(
                    recheck(
                        problem, j, [problem.start, *problem.values[:-1]][j], problem.values[j], rng.choice(OPENERS)
                    )
                )
                labels.append(0.0 if kind == "slip" and k <= t else 1.0)
    final = (
        stated[-1] if kind == "slip" else problem.answer
    )  # a fixed slip at the last event is fixed before the answer too
    steps.append(f"The answer is {final}.")
    labels.append(0.0 if kind == "slip" else 1.0)
    return Trajectory(
        problem.question,
        steps,
        labels,
        answer=str(problem.answer),
        correct=final == problem.answer,
        meta={"kind": kind, "first_error": first},
    )


def make_reflective_dataset(
    n: int,
    seed: int,
    mix: tuple[float, float, float] = (0.4, 0.3, 0.3),
    events: tuple[int, int] = (8, 14),
    reflect: float = 0.5,
) -> list[Trajectory]:
    """n labelled long solutions, one problem each, kinds drawn with weights `mix` over KINDS."""
    rng = random.Random(seed)
    out = []
    for qid in range(n):
        traj = make_reflective_solution(make_problem(rng, events), rng, rng.choices(KINDS, weights=mix)[0], reflect)
        traj.meta["qid"] = qid
        out.append(traj)
    return out


def processbench_rows(trajs: list[Trajectory]) -> list[dict]:
    """The solutions in ProcessBench's layout (problem, steps, label = the first error or -1): what `biprm eval
    processbench
    --data FILE` and `python -m benchmarks.boundaries --subsets FILE` read."""
    return [
        {
            "id": f"reflective-{t.meta['qid']}",
            "problem": t.question,
            "steps": t.steps,
            "label": t.meta["first_error"],
            "final_answer_correct": t.correct,
            "kind": t.meta["kind"],
        }
        for t in trajs
    ]
