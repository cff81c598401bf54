"""A seeded arithmetic word-problem task with exact step labels: no downloads, any tokenizer.

It gives tests and CPU-sized experiments a task where the direction of evidence is known.
A "calc" error is visible where it happens (a wrong equation), and every later result and
the answer carry it: 0 from its step on. A "claim" error is a bare statement of a wrong
value: the next step uses the true value, so the contradiction sits in a later step, which
only the right-to-left stream sees when it scores the wrong one. The solution recovers (the
later steps and the answer are right), so a claim is 0 at its own step only.
Correct steps are also written as bare claims at random, so a missing equation alone
never marks an error.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from biprm.data.trajectory import Trajectory, labels_from_first_error

KINDS = ("correct", "calc", "claim")
MAX_VALUE = 1000  # every quantity, right or wrong, stays in [1, MAX_VALUE)
BARE_CLAIM_RATE = 0.25
SLIPS = (1, -1, 2, -2, 10, -10)  # how far a calc slip (times the later divisors) or a wrong claim lands from the truth

# name, subject, object and possessive pronouns
PEOPLE = (
    ("Tom", "he", "him", "his"),
    ("Mia", "she", "her", "her"),
    ("Leo", "he", "him", "his"),
    ("Ava", "she", "her", "her"),
    ("Sam", "he", "him", "his"),
    ("Zoe", "she", "her", "her"),
    ("Omar", "he", "him", "his"),
    ("Nina", "she", "her", "her"),
)
ITEMS = ("apples", "stamps", "marbles", "cookies", "stickers", "shells", "cards", "pencils", "coins", "books")
EVENTS = {
    "+": ("{P} buys {n} more {i}", "{P} finds {n} more {i}", "A friend gives {o} {n} more {i}"),
    "-": ("{P} gives {n} {i} to a friend", "{P} sells {n} {i}", "{P} loses {n} {i}"),
    "*": ("{P} buys enough {i} to have {n} times as many as before", "{Pos} pile of {i} grows to {n} times its size"),
    "/": (
        "{P} splits the {i} into {n} equal groups and keeps one group",
        "{P} packs the {i} into {n} equal boxes and keeps one box",
    ),
}
CONNECTORS = ("Then", "After that,", "Next,", "Later,")


@dataclass
class Problem:
    """A word problem and its reference solution; event t is step t, the last step states the answer."""

    question: str
    values: list[int]  # the quantity after each event; values[-1] == answer
    answer: int
    start: int
    ops: list[tuple[str, int]]
    clauses: list[str]  # each event as a capitalised clause, reused by every solution
    pronoun: str
    item: str

    @property
    def steps(self) -> list[str]:
        """The reference solution, every step with its equation (rendered on demand: datasets never need it)."""
        operands = [self.start, *self.values[:-1]]
        return [write_step(self, t, a, c, False) for t, (a, c) in enumerate(zip(operands, self.values))] + [
            f"The answer is {self.answer}."
        ]


def apply_op(op: str, a: int, n: int) -> int:
    return a + n if op == "+" else a - n if op == "-" else a * n if op == "*" else a // n


def _chain(ops: list[tuple[str, int]], start: int) -> list[int] | None:
    """Values after each op, or None if one leaves [1, MAX_VALUE) or a division is not exact."""
    values, a = [], start
    for op, n in ops:
        if op == "/" and a % n:
            return None
        a = apply_op(op, a, n)
        if not 0 < a < MAX_VALUE:
            return None
        values.append(a)
    return values


def _pick_op(rng: random.Random, a: int) -> tuple[str, int]:
    divisors = [d for d in (2, 3, 4, 5) if a % d == 0 and a // d >= 2]
    allowed = (a + 40 < MAX_VALUE, a > 3, a * 2 < MAX_VALUE, bool(divisors))
    op = rng.choice([op for op, ok in zip("+-*/", allowed) if ok])
    if op == "+":
        return op, rng.randint(2, 40)
    if op == "-":
        return op, rng.randint(1, a - 2)
    if op == "*":
        return op, rng.choice([k for k in (2, 3, 4) if a * k < MAX_VALUE])
    return op, rng.choice(divisors)


def write_step(problem: Problem, t: int, a: int, c: int, bare: bool) -> str:
    """Event t's step: `a op n = c`, or with `bare` only the claim that the quantity is now c."""
    if bare:
        return f"{problem.clauses[t]}, so now {problem.pronoun} has {c} {problem.item}."
    op, n = problem.ops[t]
    return f"{problem.clauses[t]}, so {problem.pronoun} has {a} {op} {n} = {c} {problem.item}."


def make_problem(rng: random.Random, events: tuple[int, int] = (2, 6)) -> Problem:
    """`events` (inclusive range) on one quantity; one more solution step states the answer."""
    name, p, o, pos = rng.choice(PEOPLE)
    item = rng.choice(ITEMS)
    start = a = rng.randint(8, 60)
    ops, values = [], []
    for _ in range(rng.randint(*events)):
        op, n = _pick_op(rng, a)
        a = apply_op(op, a, n)
        ops.append((op, n))
        values.append(a)
    words = {"P": p.capitalize(), "o": o, "Pos": pos.capitalize(), "i": item}
    clauses = [rng.choice(EVENTS[op]).format(n=n, **words) for op, n in ops]
    sentences = [f"{clauses[0]}."] + [f"{rng.choice(CONNECTORS)} {c[0].lower()}{c[1:]}." for c in clauses[1:]]
    question = f"{name} has {start} {item}. {' '.join(sentences)} How many {item} does {name} have now?"
    return Problem(question, values, values[-1], start, ops, clauses, p, item)


def calc_slip(problem: Problem, k: int, value: int, rng: random.Random) -> list[int] | None:
    """A wrong result in place of `value` at event k, then the values that later correct equations build on it;
    None if no slip keeps them in range. The slip is a multiple of the later divisors, so every later division stays
    exact, and never the true value (a second slip on a wrong path cannot undo the first)."""
    later = problem.ops[k + 1 :]
    scale = math.prod(n for op, n in later if op == "/")
    for delta in rng.sample(SLIPS, len(SLIPS)):
        wrong = value + delta * scale
        chain = _chain(later, wrong) if 0 < wrong < MAX_VALUE and wrong != problem.values[k] else None
        if chain is not None:
            return [wrong] + chain
    return None


def wrong_claim(value: int, rng: random.Random) -> int:
    """A wrong value close to `value`, for a bare claim."""
    return value + rng.choice([d for d in SLIPS if 0 < value + d < MAX_VALUE])


def _calc_error(problem: Problem, rng: random.Random) -> tuple[int, list[int]]:
    """A slip at a random event (`calc_slip`), and the values the solution states from there on."""
    n_events = len(problem.ops)
    for k in rng.sample(range(n_events), n_events):  # uniform first choice; fall back elsewhere if it cannot fit
        chain = calc_slip(problem, k, problem.values[k], rng)
        if chain is not None:
            return k, problem.values[:k] + chain
    raise AssertionError("the last event always admits a slip of +-1")


def make_solution(problem: Problem, rng: random.Random, kind: str) -> Trajectory:
    """A labelled solution: "correct", "calc" (wrong equation that later steps build on) or
    "claim" (a bare wrong value that the next step contradicts by using the true one)."""
    n_events = len(problem.ops)
    bare = [rng.random() < BARE_CLAIM_RATE for _ in range(n_events)]
    stated = list(problem.values)
    first = -1
    if kind == "calc":
        first, stated = _calc_error(problem, rng)
        bare[first] = False
    elif kind == "claim":
        first = rng.randrange(n_events - 1)
        stated[first] = wrong_claim(problem.values[first], rng)
        bare[first], bare[first + 1] = True, False
    elif kind != "correct":
        raise ValueError(f"unknown kind {kind!r}; choose from {KINDS}")
    # Each equation starts from the value the solution believes, except right after a claim error.
    operands = [problem.start, *stated[:-1]]
    if kind == "claim":
        operands[first + 1] = problem.values[first]
    steps = [write_step(problem, t, operands[t], stated[t], bare[t]) for t in range(n_events)]
    steps.append(f"The answer is {stated[-1]}.")
    labels = labels_from_first_error(first, len(steps))
    if kind == "claim":
        labels = [0.0 if k == first else 1.0 for k in range(len(steps))]
    return Trajectory(
        problem.question,
        steps,
        labels,
        answer=str(problem.answer),
        correct=stated[-1] == problem.answer,
        meta={"kind": kind, "first_error": first},
    )


def make_dataset(
    n: int, seed: int, mix: tuple[float, float, float] = (0.4, 0.3, 0.3), events: tuple[int, int] = (2, 6)
) -> list[Trajectory]:
    """n labelled trajectories, one problem each, kinds drawn with weights `mix` over KINDS."""
    rng = random.Random(seed)
    trajs = []
    for qid in range(n):
        problem = make_problem(rng, events)
        traj = make_solution(problem, rng, rng.choices(KINDS, weights=mix)[0])
        traj.meta["qid"] = qid
        trajs.append(traj)
    return trajs


def make_problems(n: int, seed: int, events: tuple[int, int] = (2, 6)) -> list[Problem]:
    """n problems and no solutions: the questions of a search on the task, whose policy writes the solutions."""
    rng = random.Random(seed)
    return [make_problem(rng, events) for _ in range(n)]


def make_bon_pools(
    n_questions: int,
    n_candidates: int,
    seed: int,
    errors: tuple[float, float] = (0.5, 0.5),
    events: tuple[int, int] = (2, 6),
    correct_share: tuple[float, float] = (0.0, 1.0),
) -> list[Trajectory]:
    """Best-of-N pools: per question a share of correct candidates drawn uniformly from `correct_share`,
    the rest calc or claim errors drawn with weights `errors` (a claim's answer is right)."""
    rng = random.Random(seed)
    trajs = []
    for qid in range(n_questions):
        problem = make_problem(rng, events)
        share = rng.uniform(*correct_share)
        for cand in range(n_candidates):
            kind = "correct" if rng.random() < share else rng.choices(KINDS[1:], weights=errors)[0]
            traj = make_solution(problem, rng, kind)
            traj.meta |= {"qid": qid, "cand": cand}
            trajs.append(traj)
    return trajs
