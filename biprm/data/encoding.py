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

from biprm.data.template import STEP_TAG, TEMPLATES, Template
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


def _prefix(tokenizer: PreTrainedTokenizerBase, bos: str) -> list[int]:
    """The ids before the prompt: the BOS id where the tokenizer has one ("ids", unless it says add_bos_token=False),
    or whatever the tokenizer itself puts first when asked for special tokens ("tokenizer"), or none."""
    if bos == "ids":
        first = tokenizer.bos_token_id
        return [first] if first is not None and getattr(tokenizer, "add_bos_token", True) else []
    if bos == "tokenizer":
        bare, full = tokenizer.encode("x", add_special_tokens=False), tokenizer.encode("x")
        return full[: full.index(bare[0])] if bare and bare[0] in full else []
    return []


def add_step_tag(tokenizer: PreTrainedTokenizerBase, tag: str = STEP_TAG) -> int:
    """Make `tag` a single special token (adding it if needed) and return its id."""
    if tag not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [tag]})
    ids = tokenizer.encode(tag, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"step tag {tag!r} does not encode to one token: {ids}")
    return ids[0]


class Encoder:
    """Tokenises trajectories with a PRM kind's template (biprm's own by default); `max_length` bounds one stream."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, step_tag_id: int, max_length: int = 2048,
                 template: Template = TEMPLATES["biprm"]):
        self.tokenizer = tokenizer
        self.step_tag_id = step_tag_id
        self.max_length = max_length
        self.template = template
        self.prefix = _prefix(tokenizer, template.bos)
        self.tag_ids = tokenizer.encode(template.tag, add_special_tokens=False)
        if not template.joint and (not self.tag_ids or self.tag_ids[-1] != step_tag_id):  # a joint kind checks it in context
            raise ValueError(f"the {template.kind} step tag {template.tag!r} encodes to {self.tag_ids}, which does not end "
                             f"with the model's step_tag_id {step_tag_id}: the tokenizer does not match the model")

    def encode(self, traj: Trajectory, where: str = "trajectory") -> Encoded:
        prompt_text, texts = self.template.render(traj.question, traj.steps)
        if self.template.bos == "text":
            prompt_text = (self.tokenizer.bos_token or "") + prompt_text
        if self.template.joint:
            prompt, steps = self._joint(prompt_text, texts, where)
        else:
            prompt = self.prefix + self.tokenizer.encode(prompt_text, add_special_tokens=False)
            bare = [text[: len(text) - len(self.template.tag)] for text in texts]
            steps = [ids + self.tag_ids for ids in self.tokenizer(bare, add_special_tokens=False)["input_ids"]]
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

    def _joint(self, prompt_text: str, texts: list[str], where: str) -> tuple[list[int], list[list[int]]]:
        """The whole text tokenised at once, as the kind's reference code does, then cut into the prompt and the steps:
        a token belongs to the piece that holds its last character. The L2R stream is then exactly the reference's
        tokens, and the R2L stream the same step tokens in reverse order."""
        enc = self.tokenizer(prompt_text + "".join(texts), add_special_tokens=False, return_offsets_mapping=True)
        ends = np.cumsum([len(prompt_text), *map(len, texts)])
        last = np.array([end - 1 if end > start else start for start, end in enc["offset_mapping"]])  # a token's last character
        piece = np.searchsorted(ends, last, side="right")
        ids = np.array(enc["input_ids"])
        pieces = [ids[piece == k].tolist() for k in range(len(texts) + 1)]
        for t, step in enumerate(pieces[1:]):
            if not step or step[-1] != self.step_tag_id:
                raise DataError(f"{where}: field 'steps': step {t} does not end with the {self.template.kind} tag "
                                f"{self.template.tag!r} once tokenised with the text around it")
        return self.prefix + pieces[0], pieces[1:]

    def _check_tags(self, prompt: list[int], steps: list[list[int]], where: str) -> None:
        """The tag must occur exactly once per step, at its end; text containing the tag is an error. A kind whose tag is
        ordinary text ("\n") reads it structurally, at each step's last token, so only that is checked."""
        if not self.template.unique_tag:
            return
        ids = prompt + [i for s in steps for i in s]
        found = sum(1 for i in ids if i == self.step_tag_id)
        if found != len(steps):
            raise DataError(
                f"{where}: found {found} step-tag tokens for {len(steps)} steps; "
                "the question or a step contains the step tag text"
            )
