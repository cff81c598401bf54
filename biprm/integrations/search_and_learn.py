"""search-and-learn's PRM contract over a biprm PathScorer: per question, per output, the step probabilities.

search-and-learn's searches call `prm.score(questions, outputs)` with, per question, the
texts of its live outputs (steps joined by "\n\n"), and aggregate the step scores themselves
(last, min or prod). Its PRMs come from a hard-coded loader (`sal.models.reward_models.load_prm`),
so a run uses this one by returning it from there: its contract is duck-typed, and nothing
here imports search-and-learn.
"""

from __future__ import annotations

import numpy as np

from biprm.scoring.paths import PathScorer, check_streams, fused_scores
from biprm.search.steps import STEP_TOKEN, response_steps


class SearchAndLearnPRM:
    def __init__(self, scorer: PathScorer, step_token: str = STEP_TOKEN, streams: str = "fused"):
        check_streams(streams)
        self.scorer, self.step_token, self.streams = scorer, step_token, streams

    def score(self, questions: list[str], outputs: list[list[str]]) -> list[list[list[float]]]:
        """Every output of every question in one PathScorer call; a path past max_length has fewer scores than steps."""
        items = [
            (q, response_steps(o, self.step_token, f"question {i}, output {j}"))
            for i, (q, outs) in enumerate(zip(questions, outputs, strict=True))
            for j, o in enumerate(outs)
        ]
        paths = self.scorer.score([q for q, _ in items], [s for _, s in items], self.streams)
        scores = fused_scores(paths)
        per_path = np.split(scores.prob(), scores.offsets[1:-1])
        ends = np.cumsum([len(outs) for outs in outputs])
        return [[x.tolist() for x in per_path[end - len(outs) : end]] for outs, end in zip(outputs, ends)]
