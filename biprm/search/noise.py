"""A scorer that reads no text: the baseline a PRM-guided search must beat to show it learned anything.

Each step gets an i.i.d. standard-normal logit drawn from a hash of (seed, question,
steps up to it). A prefix therefore keeps its draws at every depth, as L2R's scores do,
and a rerun or a resumed run draws the same numbers.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from biprm.search.prm import PathScore


class NoiseScorer:
    """Implements `PathScorer`; every stream holds the same noise, and it costs no PRM tokens."""

    def __init__(self, seed: int = 0):
        self.seed, self.tokens, self.calls = seed, {}, 0

    def _draws(self, question: str, steps: Sequence[str]) -> np.ndarray:
        h = hashlib.blake2b(f"{self.seed}\0{question}".encode(), digest_size=8)
        draws = []
        for step in steps:
            h.update(b"\0" + step.encode())
            draws.append(np.random.default_rng(int.from_bytes(h.copy().digest(), "little")).standard_normal())
        return np.array(draws)

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]], streams: str = "fused") -> list[PathScore]:
        self.calls += 1
        return [PathScore(l2r=(x := self._draws(q, p)), r2l=x, fused=x) for q, p in zip(questions, paths)]
