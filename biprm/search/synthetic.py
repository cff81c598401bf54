"""A scripted policy for the synthetic task: each step right, or a calc slip or a wrong claim at a known rate.

It is not a model. It knows the `Problem` behind each question (`--data synthetic:N:SEED`
builds the questions and the policy from the same generator) and writes the next step in
the task's own wording. At each event step it draws a calc slip with probability
`calc_rate`: a visible wrong result that later steps build on, so the answer ends wrong.
With probability `claim_rate` it draws a bare wrong claim, which the next step contradicts
by using the true value, so the answer stays right. As in the task's training data, a claim
is drawn only where another event step follows to contradict it, and never right after a
claim (that step shows the equation). Otherwise the step is right. The last step states the answer. A search study on it
therefore knows how often a single sample is wrong, and why.

Each draw comes from a hash of (seed, question, prefix, how often that prefix was asked
since `reseed`), so a rerun writes the same steps, whatever else shares its batch, and so
does a resumed one (the counts are in the batch's checkpoint).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from typing import Sequence

from biprm.data.readers import synthetic_spec
from biprm.data.synthetic import BARE_CLAIM_RATE, Problem, apply_op, calc_slip, make_problems, write_step, wrong_claim
from biprm.search.policy import Ending, StepPolicy
from biprm.search.steps import split_steps

_STATED = re.compile(r"(\d+) \w+\.$")  # every event step ends "... <value> <item>."


def synthetic_problems(data: str) -> list[Problem] | None:
    """The problems of `--data synthetic[:N[:SEED]]` (N questions of seed SEED); None for any other data."""
    spec = synthetic_spec(data)
    return None if spec is None else make_problems(*spec)


class SyntheticPolicy(StepPolicy):
    """`StepPolicy` over the synthetic task's problems; `tokenizer` (optional) only counts the tokens it writes."""

    def __init__(
        self, problems: Sequence[Problem], calc_rate: float, claim_rate: float, seed: int = 0, tokenizer=None, **kw
    ):
        if not (0 <= calc_rate and 0 <= claim_rate and calc_rate + claim_rate <= 1):
            raise ValueError(
                f"--calc-rate {calc_rate} and --claim-rate {claim_rate}: each must be >= 0 and their sum <= 1"
            )
        super().__init__(tokenizer, **kw)
        self.problems = {p.question: p for p in problems}
        self.calc_rate, self.claim_rate, self.seed = calc_rate, claim_rate, seed
        self.asked: Counter[tuple[str, ...]] = Counter()

    def _head(self, question: str) -> str:
        return question + self.step_token  # never a chat template: the policy reads its prompts back

    def reseed(self, seed: int) -> None:
        """Start every prefix's draws over; they depend on the policy's own seed, not on the batch."""
        self.asked.clear()

    def state(self) -> dict:
        return {"asked": [[list(key), count] for key, count in self.asked.items()]}

    def restore(self, state: dict) -> None:
        self.asked = Counter({tuple(key): count for key, count in state["asked"]})

    def _generate(self, prompts: list[str], n: int, max_tokens: int, stop: list[str]) -> list[tuple[str, Ending, int]]:
        if not stop:
            raise ValueError("the synthetic policy writes one step per call: draw its pool with --pool-draw steps")
        out = []
        for prompt in prompts:
            question, *steps = split_steps(prompt, self.step_token)
            if question not in self.problems:
                raise ValueError(
                    f"synthetic policy: no problem behind the question {question[:80]!r}; use --data "
                    "synthetic[:N[:SEED]]"
                )
            for _ in range(n):
                text, last = self.next_step(self.problems[question], steps, self._rng(question, steps))
                tokens = (
                    len(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else len(text.split())
                )
                out.append((text, "end", tokens) if last else (text + self.step_token, "step", tokens))
        return out

    def _rng(self, question: str, steps: list[str]) -> random.Random:
        key = (question, *steps)
        h = hashlib.blake2b("\0".join([str(self.seed), *key, str(self.asked[key])]).encode(), digest_size=8)
        self.asked[key] += 1
        return random.Random(int.from_bytes(h.digest(), "little"))

    def next_step(self, problem: Problem, steps: list[str], rng: random.Random) -> tuple[str, bool]:
        """(the step after `steps`, whether it is the last one)."""
        carried, after_claim = replay(problem, steps)
        t = len(steps)
        if t == len(problem.ops):
            return f"The answer is {carried}.", True
        op, n = problem.ops[t]
        right, u = apply_op(op, carried, n), rng.random()
        if u < self.calc_rate and (slip := calc_slip(problem, t, right, rng)) is not None:
            return write_step(problem, t, carried, slip[0], bare=False), False
        if self.calc_rate <= u < self.calc_rate + self.claim_rate and t + 1 < len(problem.ops) and not after_claim:
            return write_step(problem, t, carried, wrong_claim(right, rng), bare=True), False
        bare = (
            not after_claim and rng.random() < BARE_CLAIM_RATE
        )  # the step after a claim shows the equation that contradicts it
        return write_step(problem, t, carried, right, bare), False


def replay(problem: Problem, steps: list[str]) -> tuple[int, bool]:
    """(the value the next step builds on, whether the last step was a wrong claim) after `steps`.

    An equation's result is carried on, right or slipped. A bare step's value is not: the next step builds on
    the value it should have stated, which is what contradicts a wrong claim."""
    carried, claim = problem.start, False
    for t, step in enumerate(steps):
        stated = _STATED.search(step)
        if t >= len(problem.ops) or stated is None:
            raise ValueError(f"synthetic policy: step {t + 1} {step!r} is not an event step of the synthetic task")
        op, n = problem.ops[t]
        right = apply_op(op, carried, n)
        equation = "=" in step
        claim = not equation and int(stated[1]) != right
        carried = int(stated[1]) if equation else right
    return carried, claim
