"""A scripted policy and a scripted PRM for search tests: trees whose every choice can be worked out by hand."""

from __future__ import annotations

from collections import Counter

import numpy as np

from biprm.search.policy import StepOut
from biprm.scoring.paths import PathScore

SEP = "||"


class ScriptedPolicy:
    """`tree[(question, *steps)]` lists the children of that prefix; each request for a prefix takes its next child
    (cycling), so asking a prefix twice gives its first two children. A step starting with "answer" ends the
    solution."""

    def __init__(self, tree: dict[tuple[str, ...], list[str]]):
        self.tree, self.asked, self.tokens, self.calls = tree, Counter(), 0, 0

    def reseed(self, seed: int) -> None:
        pass  # deterministic

    def state(self) -> dict:
        return {"asked": [[list(key), count] for key, count in self.asked.items()]}

    def restore(self, state: dict) -> None:
        self.asked = Counter({tuple(key): count for key, count in state["asked"]})

    def prompt(self, question: str, steps) -> str:
        return SEP.join([question, *steps])

    def next_step(self, key: tuple[str, ...]) -> str:
        kids = self.tree[key]
        text = kids[self.asked[key] % len(kids)]
        self.asked[key] += 1
        return text

    def generate_step(self, prompts: list[str], n: int) -> list[StepOut]:
        self.calls += 1
        outs = [
            StepOut(t, finished=t.startswith("answer"), capped=False, tokens=len(t))
            for p in prompts
            for t in [self.next_step(tuple(p.split(SEP))) for _ in range(n)]
        ]
        self.tokens += sum(o.tokens for o in outs)
        return outs

    def generate_solution(self, prompts: list[str], n: int, max_steps: int) -> list[list[StepOut]]:
        """n whole solutions per prompt in one call: each walks the tree as a step-by-step draw would, one child a
        step."""
        self.calls += 1
        outs = []
        for p in prompts:
            for _ in range(n):
                key, steps = tuple(p.split(SEP)), []
                while not steps or not (steps[-1].finished or len(steps) >= max_steps):
                    text = self.next_step(key)
                    steps.append(StepOut(text, finished=text.startswith("answer"), capped=False, tokens=len(text)))
                    key += (text,)
                outs.append(steps)
        self.tokens += sum(o.tokens for steps in outs for o in steps)
        return outs


class ScriptedScorer:
    """Step logits looked up by step text (fused in `fused`, L2R in `l2r`, default: the fused value); paths longer than
    `max_steps` are scored on their first `max_steps` steps and flagged, as a PRM past its max_length does."""

    def __init__(self, fused: dict[str, float], l2r: dict[str, float] | None = None, max_steps: int = 100):
        self.fused, self.l2r, self.max_steps = fused, l2r or {}, max_steps
        self.tokens, self.calls, self.seen = {"l2r": 0, "r2l": 0}, 0, []

    def score(self, questions, paths, streams="fused"):
        self.calls += 1
        self.seen.append((streams, [tuple(p) for p in paths]))
        out = []
        for steps in paths:
            fit = list(steps)[: self.max_steps]
            l2r = np.array([self.l2r.get(s, self.fused[s]) for s in fit])
            self.tokens["l2r"] += len(fit)
            if streams == "l2r":
                out.append(PathScore(l2r, None, l2r, len(steps) - len(fit)))
                continue
            self.tokens["r2l"] += len(fit)
            out.append(PathScore(l2r, None, np.array([self.fused[s] for s in fit]), len(steps) - len(fit)))
        return out
