"""Trajectory -> token pieces shared by the L2R and R2L streams.

A trajectory is encoded once as a prompt and one token list per step (each ending
with the step-tag id). The L2R stream is prompt + s_1 .. s_T and the R2L stream is
prompt + s_T .. s_1, so both are built from the same pieces and can never disagree
on where a step starts or ends. Each piece is tokenised on its own, which keeps the
step tag a single, known id whatever text surrounds it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from transformers import PreTrainedTokenizerBase

from biprm.data.template import STEP_TAG, render_prompt, render_step
from biprm.data.trajectory import DataError, Trajectory

T = TypeVar("T", bound=Sequence)


def stream_order(steps: T, stream: str) -> T:
    """Per-step items in the order `stream` reads the steps: L2R s_1..s_T, R2L s_T..s_1. Applied to a
    stream's per-step outputs it turns them back into forward step order (the reversal is its own inverse)."""
    return steps if stream == "l2r" else steps[::-1]


def tag_ends(step_lengths: Sequence[int], stream: str, start: int = 0) -> np.ndarray:
    """Where each step's tag (its last token) sits in `stream`'s row, whose steps begin at `start`; forward step order."""
    return stream_order(start + np.cumsum(stream_order(step_lengths, stream)) - 1, stream)


@dataclass
class Encoded:
    prompt: list[int]
    steps: list[list[int]]  # every step ends with the step-tag id
    labels: list[float] | None
    n_dropped: int = 0  # trailing steps cut to fit max_length

    @property
    def n_tokens(self) -> int:
        """Tokens of one stream (prompt + all steps)."""
        return len(self.prompt) + sum(len(s) for s in self.steps)

    def continuation(self, stream: str) -> list[int]:
        """The tokens `stream` reads after the prompt: its steps, in its order."""
        return [t for step in stream_order(self.steps, stream) for t in step]

    def stream(self, stream: str) -> list[int]:
        """The whole row `stream` reads: the prompt, then its continuation."""
        return self.prompt + self.continuation(stream)


def add_step_tag(tokenizer: PreTrainedTokenizerBase, tag: str = STEP_TAG) -> int:
    """Make `tag` a single special token (adding it if needed) and return its id."""
    if tag not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [tag]})
    ids = tokenizer.encode(tag, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"step tag {tag!r} does not encode to one token: {ids}")
    return ids[0]


class Encoder:
    """Tokenises trajectories with the one template; `max_length` bounds one stream."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, step_tag_id: int, max_length: int = 2048):
        self.tokenizer = tokenizer
        self.step_tag_id = step_tag_id
        self.max_length = max_length
        bos = tokenizer.bos_token_id
        self.prefix = [bos] if bos is not None and getattr(tokenizer, "add_bos_token", True) else []

    def encode(self, traj: Trajectory, where: str = "trajectory") -> Encoded:
        tok = self.tokenizer
        prompt = self.prefix + tok.encode(render_prompt(traj.question), add_special_tokens=False)
        texts = [render_step(s) for s in traj.steps]
        steps = [ids + [self.step_tag_id] for ids in tok(texts, add_special_tokens=False)["input_ids"]]
        self._check_tags(prompt, steps, where)
        budget = self.max_length - len(prompt)
        keep = 0
        for step in steps:  # drop whole trailing steps, identically for both streams
            if len(step) > budget:
                break
            budget -= len(step)
            keep += 1
        if keep == 0:
            raise DataError(
                f"{where}: prompt and first step need more than max_length={self.max_length} tokens"
            )
        labels = None if traj.labels is None else traj.labels[:keep]
        return Encoded(prompt, steps[:keep], labels, n_dropped=len(steps) - keep)

    def _check_tags(self, prompt: list[int], steps: list[list[int]], where: str) -> None:
        """The tag must occur exactly once per step, at its end; text containing the tag is an error."""
        ids = prompt + [i for s in steps for i in s]
        found = sum(1 for i in ids if i == self.step_tag_id)
        if found != len(steps):
            raise DataError(
                f"{where}: found {found} step-tag tokens for {len(steps)} steps; "
                "the question or a step contains the step tag text"
            )
