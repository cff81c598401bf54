"""A running `biprm serve` as a search's PathScorer: every path of a call in one POST /v1/score.

The server scores each path whole (its batcher shares the prompt between paths, but it
keeps no KV cache between requests), so a served search pays L2R from scratch at every
depth, O(D^2) tokens per path like R2L; use `PrefixScorer` in-process for incremental L2R.
The server does not report tokens, so `tokens` stays empty; `calls` counts requests.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Sequence

from biprm.scoring.step_scores import StepScores, offsets_of
from biprm.scoring.paths import PathScore, check_streams, path_scores


class ServedScorer:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0):
        """`url`: the server's root, e.g. http://127.0.0.1:8000; `api_key`: its --api-key, if it has one."""
        self.url, self.api_key, self.timeout = url.rstrip("/"), api_key, timeout
        self.tokens: dict[str, int] = {}
        self.calls = 0

    def score(
        self, questions: Sequence[str], paths: Sequence[Sequence[str]], streams: str = "fused"
    ) -> list[PathScore]:
        """Per-step logits of every path, as `PrefixScorer` gives them (the server's probabilities, mapped back)."""
        check_streams(streams)
        body = [{"question": q, "steps": list(p)} for q, p in zip(questions, paths, strict=True)]
        rows = self._post("/v1/score", body)
        self.calls += 1
        if streams == "l2r" and rows[0]["l2r"] is None:
            raise ValueError(f"streams='l2r' needs a model with an L2R stream; the server at {self.url} has none")
        lengths = [len(r["fused"]) for r in rows]
        flat = lambda k: None if rows[0][k] is None else [x for r in rows for x in r[k]]  # noqa: E731
        logits = StepScores.from_probs(offsets_of(lengths), flat("fused"), flat("l2r"), flat("r2l"))
        dropped = [len(p) - r["steps_scored"] for p, r in zip(paths, rows)]
        return path_scores(lengths, dropped, logits.l2r, logits.r2l, logits.fused, streams)

    def _post(self, route: str, body: object) -> list[dict]:
        """The parsed answer; a refusal or an unreachable server is one error line naming the URL and the server's
        reason."""
        headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        )
        request = urllib.request.Request(self.url + route, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            reason = error.read().decode(errors="replace")
            raise RuntimeError(
                f"{self.url}{route}: HTTP {error.code}: "
                f"{json.loads(reason).get('error', reason) if reason.startswith('{') else reason}"
            ) from None
        except urllib.error.URLError as error:
            raise RuntimeError(f"{self.url}{route}: cannot reach the server ({error.reason})") from None
