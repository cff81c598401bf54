"""A BiPRM as a TRL GRPO reward function.

TRL calls every reward function as `f(prompts=..., completions=..., **columns)` and
expects one float per completion. Here each completion is cut into steps, scored with
a local `Scorer` or a running `biprm serve`, and reduced to one number by an
aggregation (min, the paper's, unless chosen otherwise):

    from biprm.integrations.grpo import BiPRMReward
    reward = BiPRMReward(scorer=Scorer.from_pretrained("runs/biprm"))   # or url="http://rm-host:8000"
    GRPOTrainer(model=policy, reward_funcs=[reward], ...)
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any

from biprm.aggregate import AGGREGATIONS
from biprm.readers import EMPTY_RESPONSE, split_steps
from biprm.scoring import Scorer
from biprm.trajectory import Trajectory


def message_text(x: str | list[dict[str, Any]], role: str) -> str:
    """A plain string as is; a conversation (TRL's conversational format) -> the content of its last `role` message."""
    if isinstance(x, str):
        return x
    contents = [m["content"] for m in x if m.get("role") == role]
    if not contents:
        raise ValueError(f"a conversational prompt or completion has no {role!r} message: {x!r}")
    return contents[-1]


class BiPRMReward:
    """Callable with TRL's reward-function signature; `__name__` names its column in TRL's logs."""

    __name__ = "biprm"

    def __init__(self, scorer: Scorer | None = None, url: str | None = None, aggregation: str = "min", split: str = "auto", timeout: float = 600.0):
        if (scorer is None) == (url is None):
            raise ValueError("give exactly one of `scorer` (score in this process) and `url` (a running `biprm serve`)")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {aggregation!r}: choose one of {AGGREGATIONS}")
        split_steps("", split)  # an unknown rule fails here, not at the first training step
        self.scorer, self.url, self.aggregation, self.split, self.timeout = scorer, url and url.rstrip("/"), aggregation, split, timeout

    def trajectories(self, prompts: list, completions: list) -> list[Trajectory]:
        """One trajectory per completion; a completion with no text becomes one placeholder step (it still gets a score)."""
        return [
            Trajectory(message_text(p, "user"), split_steps(message_text(c, "assistant"), self.split) or [EMPTY_RESPONSE])
            for p, c in zip(prompts, completions, strict=True)
        ]

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        trajs = self.trajectories(prompts, completions)
        if self.scorer is not None:
            return self.scorer.score(trajs, progress=False).solution_scores(self.aggregation).tolist()
        body = json.dumps([{"question": t.question, "steps": t.steps} for t in trajs]).encode()
        req = urllib.request.Request(f"{self.url}/v1/score", body, {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            return [row["solution"][self.aggregation] for row in json.loads(r.read())]
