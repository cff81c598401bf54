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
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any

from biprm.scoring.aggregate import AGGREGATIONS
from biprm.data.readers import split_steps
from biprm.data.trajectory import DataError, Trajectory, validate
from biprm.evaluation.grading import extract_answer, grade_many
from biprm.scoring.step_scores import score_rows
from biprm.scoring.scorer import Scorer
from biprm.serve.config import API_KEY_ENV

log = logging.getLogger(__name__)


def message_text(x: str | list[dict[str, Any]], role: str) -> str:
    """A plain string as is; a conversation (TRL's conversational format) -> the content of its last `role` message."""
    if isinstance(x, str):
        return x
    contents = [m["content"] for m in x if m.get("role") == role]
    if not contents:
        raise ValueError(f"a conversational prompt or completion has no {role!r} message: {x!r}")
    return contents[-1]


class BiPRMReward:
    """Callable with TRL's reward-function signature; `__name__` names its column in TRL's logs.

    A completion that cannot be scored (no step text, step-tag text in it, a prompt longer
    than the model's max_length) gets `invalid_reward` and a warning, instead of stopping
    the training step. Against a server, requests go in slices of `request_size`
    solutions, a busy server (503) is retried with backoff, and `api_key` (default:
    $BIPRM_API_KEY) is sent as a bearer token.
    """

    __name__ = "biprm"

    def __init__(
        self,
        scorer: Scorer | None = None,
        url: str | None = None,
        aggregation: str = "min",
        split: str = "auto",
        invalid_reward: float = 0.0,
        request_size: int = 64,
        retries: int = 8,
        timeout: float = 600.0,
        api_key: str | None = None,
    ):
        if (scorer is None) == (url is None):
            raise ValueError("give exactly one of `scorer` (score in this process) and `url` (a running `biprm serve`)")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {aggregation!r}: choose one of {AGGREGATIONS}")
        split_steps("", split)  # an unknown rule fails here, not at the first training step
        self.scorer, self.url, self.aggregation, self.split = scorer, url and url.rstrip("/"), aggregation, split
        self.invalid_reward, self.request_size, self.retries, self.timeout = (
            invalid_reward,
            request_size,
            retries,
            timeout,
        )
        key = api_key or os.environ.get(API_KEY_ENV)
        self.headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}

    def trajectories(self, prompts: list, completions: list) -> list[Trajectory]:
        """One trajectory per completion (a completion with no step text has no steps)."""
        return [
            Trajectory(message_text(p, "user"), split_steps(message_text(c, "assistant"), self.split))
            for p, c in zip(prompts, completions, strict=True)
        ]

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        rows, why = self.rows(prompts, completions)
        if why:
            log.warning(
                "%d of %d completions could not be scored and get reward %g; first: %s",
                len(why),
                len(rows),
                self.invalid_reward,
                why[0],
            )
        return [self.invalid_reward if row is None else row["solution"][self.aggregation] for row in rows]

    def rows(self, prompts: list, completions: list) -> tuple[list[dict | None], list[str]]:
        """One score row per completion (`biprm score`'s keys: steps, l2r, r2l, sigma, fused, solution, ...),
        None for one that cannot be scored, and why each of those could not."""
        trajs = self.trajectories(prompts, completions)
        rows, why = self._local(trajs) if self.scorer is not None else self._remote(trajs)
        return [rows.get(i) for i in range(len(trajs))], why

    def _local(self, trajs: list[Trajectory]) -> tuple[dict[int, dict], list[str]]:
        """({completion: row}, why the others got none): each completion is encoded once, then scored from its
        encoding."""
        encs, problems = self.scorer.encode(trajs, [f"completion {i}" for i in range(len(trajs))], skip_invalid=True)
        bad = {i for i, _ in problems}
        ok = [i for i in range(len(trajs)) if i not in bad]
        rows = score_rows([trajs[i] for i in ok], self.scorer.score(encs, progress=False), digits=None) if encs else []
        return dict(zip(ok, rows)), [error for _, error in problems]

    def _remote(self, trajs: list[Trajectory]) -> tuple[dict[int, dict], list[str]]:
        """`_local` through the server, which encodes; what it would refuse as a 400 is caught here first."""
        ok, why, out = [], [], {}
        for i, traj in enumerate(trajs):
            try:
                validate(traj, f"completion {i}")
            except DataError as error:
                why.append(str(error))
                continue
            ok.append(i)
        for a in range(0, len(ok), self.request_size):
            part = ok[a : a + self.request_size]
            try:
                out |= dict(zip(part, self._post([trajs[i] for i in part])))
            except urllib.error.HTTPError as error:
                if error.code not in (400, 413):
                    raise
                for i in part:  # one refused solution refuses its request: find it
                    if (row := self._one(trajs[i], why)) is not None:
                        out[i] = row
        return out, why

    def _one(self, traj: Trajectory, why: list[str]) -> dict | None:
        try:
            return self._post([traj])[0]
        except urllib.error.HTTPError as error:
            if error.code not in (400, 413):
                raise
            why.append(json.loads(error.read() or b"{}").get("error", str(error)))
            return None

    def _post(self, trajs: list[Trajectory]) -> list[dict]:
        body = json.dumps([{"question": t.question, "steps": t.steps} for t in trajs]).encode()
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(f"{self.url}/v1/score", body, self.headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as error:
                if error.code != 503 or attempt == self.retries:
                    raise
                time.sleep(min(30.0, float(error.headers.get("Retry-After", 1)) * 2**attempt))
        raise AssertionError("unreachable")


class AnswerReward:
    """An outcome reward in TRL's signature: 1.0 when a completion's final answer equals the dataset's answer
    column under math-verify (gold first), 0.0 when not, None when grading timed out (TRL leaves it out).

    Grading runs in `workers` processes, each answer bounded by `timeout` seconds (workers=0: inline).
    """

    __name__ = "correct"

    def __init__(self, column: str = "answer", workers: int = 2, timeout: float = 5.0):
        self.column, self.workers, self.timeout = column, workers, timeout

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float | None]:
        if self.column not in kwargs:
            raise ValueError(
                f"the training dataset has no {self.column!r} column for AnswerReward to grade against "
                "(AnswerReward(column=...))"
            )
        pairs = [
            (str(gold), extract_answer(message_text(c, "assistant")))
            for gold, c in zip(kwargs[self.column], completions, strict=True)
        ]
        return [None if v is None else float(v) for v in grade_many(pairs, self.workers, self.timeout)]
