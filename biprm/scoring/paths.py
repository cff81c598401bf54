"""The contract every path scorer keeps: per-step scores of partial solutions, as a search asks for them.

A partial solution of depth D is scored the way a finished one is, on its D steps:
- L2R reads the question then steps 1..D, so a prefix's scores never change when a
  step is added;
- R2L reads the question then steps D..1, so the newest step is scored from the
  question alone, and every earlier step's R2L score changes at each depth;
- the gate fuses the two per step as in training.

Scores are float64 logits, as `StepScores` holds them (sigmoid gives the probability):
in float32 probabilities near 1 round to a few values, and a search would then pick among
tied paths by their order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from biprm.scoring.step_scores import StepScores, offsets_of

STREAMS = ("fused", "l2r")  # "fused": both streams and the gate; "l2r": the L2R stream alone


@dataclass
class PathScore:
    """Per-step outputs for one partial solution; `fused` is what a search ranks by."""

    l2r: np.ndarray | None
    r2l: np.ndarray | None
    fused: np.ndarray
    n_dropped: int = 0  # trailing steps past the PRM's max_length: flagged, never cut silently


def fused_scores(paths: Sequence[PathScore]) -> StepScores:
    """The ranked step logits of every path, flat, so biprm's aggregations and probabilities read them as any scored
    set."""
    return StepScores(offsets_of([len(p.fused) for p in paths]), np.concatenate([p.fused for p in paths]))


def check_streams(streams: str) -> None:
    if streams not in STREAMS:
        raise ValueError(f"streams must be one of {STREAMS}, got {streams!r}")


def path_scores(lengths: Sequence[int], n_dropped: Sequence[int], l2r, r2l, fused, streams: str) -> list[PathScore]:
    """Flat per-step logits of several paths -> one PathScore each. With streams="l2r" the L2R
    logits are what a search ranks by, and no R2L score is given even where one was computed."""
    if streams == "l2r":
        r2l, fused = None, l2r
    cut = lambda x: None if x is None else np.split(np.asarray(x, dtype=np.float64), np.cumsum(lengths)[:-1])  # noqa: E731
    l2r, r2l, fused = cut(l2r), cut(r2l), cut(fused)
    return [
        PathScore(None if l2r is None else l2r[i], None if r2l is None else r2l[i], fused[i], int(d))
        for i, d in enumerate(n_dropped)
    ]


class PathScorer(Protocol):
    """Scores every path of a search level in one call; `tokens` counts PRM tokens per stream."""

    tokens: dict[str, int]
    calls: int

    def score(
        self, questions: Sequence[str], paths: Sequence[Sequence[str]], streams: str = "fused"
    ) -> list[PathScore]: ...
