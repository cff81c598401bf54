"""What a search asks of a process reward model: per-step scores of partial solutions.

A partial solution of depth D is scored the way a finished one is, on its D steps:
- L2R reads the question then steps 1..D, so a prefix's scores never change when a
  step is added;
- R2L reads the question then steps D..1, so the newest step is scored from the
  question alone, and every earlier step's R2L score changes at each depth;
- the gate fuses the two per step as in training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

STREAMS = ("fused", "l2r")  # "fused": both streams and the gate; "l2r": the L2R stream alone


@dataclass
class PathScore:
    """Per-step outputs for one partial solution; `fused` is what a search ranks by."""

    l2r: np.ndarray | None
    r2l: np.ndarray | None
    fused: np.ndarray
    n_dropped: int = 0  # trailing steps past the PRM's max_length: flagged, never cut silently


class PathScorer(Protocol):
    """Scores every path of a search level in one call; `tokens` counts PRM tokens per stream."""

    tokens: dict[str, int]
    calls: int

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]], streams: str = "fused") -> list[PathScore]:
        ...
