"""A scorer that reads no text: the baseline a PRM-guided search must beat to show it learned anything.

Each step gets an i.i.d. standard-normal logit drawn from a hash of (seed, question,
steps up to it). A prefix therefore keeps its draws at every depth, as L2R's scores do,
and a rerun or a resumed run draws the same numbers. Paths of one call with the same text
(siblings that sampled the same step) get separate draws for their newest step: keyed on
text alone, a step written in fewer ways (on the synthetic task, a right step) would hold
fewer draws than one written in many, and lose the maximum more often, so "noise" would
read the text after all. That separate draw lasts while the step is newest: one level on,
the copy's step takes its twin's draw again (only aggregations other than "last" see it).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Sequence

import numpy as np

from biprm.scoring.paths import PathScore


class NoiseScorer:
    """Implements `PathScorer`; every stream holds the same noise, and it costs no PRM tokens."""

    def __init__(self, seed: int = 0):
        self.seed, self.tokens, self.calls = seed, {}, 0

    def _draws(self, question: str, steps: Sequence[str], copy: int) -> np.ndarray:
        """Step draws; `copy` (how many identical paths came before this one in the call) enters the newest step's."""
        h = hashlib.blake2b(f"{self.seed}\0{question}".encode(), digest_size=8)
        draws = []
        for k, step in enumerate(steps):
            h.update(b"\0" + step.encode())
            key = h.copy()
            if copy and k == len(steps) - 1:
                key.update(f"\0copy {copy}".encode())
            draws.append(np.random.default_rng(int.from_bytes(key.digest(), "little")).standard_normal())
        return np.array(draws)

    def score(
        self, questions: Sequence[str], paths: Sequence[Sequence[str]], streams: str = "fused"
    ) -> list[PathScore]:
        self.calls += 1
        seen: Counter[tuple[str, ...]] = Counter()
        out = []
        for q, p in zip(questions, paths):
            key = (q, *p)
            out.append(PathScore(l2r=(x := self._draws(q, p, seen[key])), r2l=x, fused=x))
            seen[key] += 1
        return out
