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
    """Where each step's tag (its last token) sits in `stream`'s row, whose steps begin at `start`; forward step
    order."""
    return stream_order(start + np.cumsum(stream_order(step_lengths, stream)) - 1, stream)


OVERLENGTH = ("head", "refuse", "tail", "window")  # what a trajectory past max_length gets (`Encoder`)


class Unscorable(DataError):
    """A trajectory no policy but refusal can score: its prompt and one step alone exceed max_length. Evaluation
    counts such a row and goes on without it; every other caller stops on it as on any bad input."""


@dataclass
class Encoded:
    prompt: list[int]
    steps: list[list[int]]  # every step ends with the step-tag id
    labels: list[float] | None
    n_dropped: int = 0  # steps cut to fit max_length: trailing ones, or leading ones where `first` > 0
    first: int = 0  # the trajectory's index of steps[0]: > 0 where leading steps were dropped ("tail")
    windowed: bool = False  # past max_length, every step kept: scored in overlapping windows ("window")
    closing: list[list[int]] | None = None  # each step's tokens where it ends the answer, without its tag (`Encoder`)

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


def step_windows(lengths: Sequence[int], budget: int, overlap: float = 0.5) -> list[tuple[int, int]]:
    """[a, b) runs of steps, each within `budget` tokens, that cover every step in order: each run holds as many steps
    as fit from its start, and the next starts where about `overlap` of the budget of steps before the last run's end
    is kept as context. Read left to right, a step has the most context in the first run that holds it (`first_runs`).
    Every step must fit the budget alone."""
    windows, a, T = [], 0, len(lengths)
    while True:
        b, used = a, 0
        while b < T and used + lengths[b] <= budget:
            used, b = used + lengths[b], b + 1
        windows.append((a, b))
        if b == T:
            return windows
        nxt, kept = b, 0  # back from b while the context kept fits `overlap` and step b still fits with it
        while (
            nxt - 1 > a
            and kept + lengths[nxt - 1] <= overlap * budget
            and kept + lengths[nxt - 1] + lengths[b] <= budget
        ):
            nxt, kept = nxt - 1, kept + lengths[nxt - 1]
        a = nxt


def first_runs(windows: list[tuple[int, int]], n_steps: int) -> list[tuple[int, int]]:
    """(run, position in it) of each step in the first run that holds it."""
    out, j = [], 0
    for t in range(n_steps):
        while not windows[j][0] <= t < windows[j][1]:
            j += 1
        out.append((j, t - windows[j][0]))
    return out


class Encoder:
    """Tokenises trajectories with a PRM kind's template (biprm's own by default); `max_length` bounds one stream.

    A trajectory past it gets what `overlength` declares: "head" keeps the question and the first steps that fit,
    "tail" the question and the last ones, "refuse" is an error naming the row and its length, and "window" keeps
    every step (the scorer reads it in overlapping windows, `step_windows`). A dropped step is counted (`n_dropped`)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        step_tag_id: int,
        max_length: int = 2048,
        template: Template = TEMPLATES["biprm"],
        overlength: str = "head",
    ):
        if overlength not in OVERLENGTH:
            raise ValueError(f"overlength {overlength!r}: choose one of {', '.join(OVERLENGTH)}")
        self.tokenizer = tokenizer
        self.step_tag_id = step_tag_id
        self.max_length = max_length
        self.template = template
        self.overlength = overlength
        self.prefix = _prefix(tokenizer, template.bos)
        self.tag_ids = tokenizer.encode(template.tag, add_special_tokens=False)
        if not template.joint and (
            not self.tag_ids or self.tag_ids[-1] != step_tag_id
        ):  # a joint kind checks it in context
            raise ValueError(
                f"the {template.kind} step tag {template.tag!r} encodes to {self.tag_ids}, which does not end "
                f"with the model's step_tag_id {step_tag_id}: the tokenizer does not match the model"
            )

    def encode(self, traj: Trajectory, where: str = "trajectory") -> Encoded:
        prompt_text, texts = self.template.render(traj.question, traj.steps)
        if self.template.bos == "text":
            prompt_text = (self.tokenizer.bos_token or "") + prompt_text
        closing = None
        if self.template.joint:
            prompt, steps = self._joint(prompt_text, texts, where)
            if self.template.close:
                closing = self.tokenizer(self._bare(texts), add_special_tokens=False)["input_ids"]
        else:
            prompt = self.prefix + self.tokenizer.encode(prompt_text, add_special_tokens=False)
            steps = self._pieces(self._bare(texts), where)
        self._check_tags(prompt, steps, where)
        return self._fit(prompt, steps, traj.labels, where, closing)

    def _pieces(self, bare: list[str], where: str) -> list[list[int]]:
        """Each step's ids, then the tag's, each step tokenised on its own. A kind whose card cuts the whole solution
        on its tag (`Template.splits`: Skywork's "\\n") reads a step holding the tag as the card does: each non-empty
        line tokenised on its own and followed by the tag; the step's score is the card's after its last line."""
        if not self.template.splits:
            return [ids + self.tag_ids for ids in self.tokenizer(bare, add_special_tokens=False)["input_ids"]]
        lines = [[part for part in text.split(self.template.tag) if part] for text in bare]
        if empty := [t for t, parts in enumerate(lines) if not parts]:
            raise DataError(
                f"{where}: field 'steps': step {empty[0]} is empty once cut on {self.template.tag!r}, where the "
                f"{self.template.kind} card's code reads no step at all; drop it"
            )
        ids = iter(self.tokenizer([p for parts in lines for p in parts], add_special_tokens=False)["input_ids"])
        return [[i for _ in parts for i in next(ids) + self.tag_ids] for parts in lines]

    def _bare(self, texts: list[str]) -> list[str]:
        """Each step's text without its tag."""
        return [text[: len(text) - len(self.template.tag)] for text in texts]

    def _fit(
        self,
        prompt: list[int],
        steps: list[list[int]],
        labels: list[float] | None,
        where: str,
        closing: list[list[int]] | None = None,
    ) -> Encoded:
        """The encoding under `overlength`: whole steps are dropped, identically for both streams, or none."""
        budget, total = self.max_length - len(prompt), len(prompt) + sum(map(len, steps))
        if total <= self.max_length:
            return Encoded(prompt, steps, labels, closing=closing)
        if self.overlength == "refuse":
            raise DataError(f"{where}: {total} tokens, past max_length={self.max_length} (overlength policy: refuse)")
        if self.overlength != "head":
            longest = max(range(len(steps)), key=lambda t: len(steps[t]))
            if len(steps[longest]) > budget:
                raise Unscorable(
                    f"{where}: step {longest} alone needs {len(steps[longest])} tokens, past the "
                    f"{budget} that max_length={self.max_length} leaves after the prompt"
                )
            if self.overlength == "window":
                return Encoded(prompt, steps, labels, windowed=True, closing=closing)
        order = steps if self.overlength == "head" else steps[::-1]
        fit = np.cumsum([len(s) for s in order]) <= budget
        keep = int(fit.argmin()) if not fit.all() else len(steps)
        if keep == 0:
            raise Unscorable(f"{where}: prompt and first step need more than max_length={self.max_length} tokens")
        first = 0 if self.overlength == "head" else len(steps) - keep
        kept = None if labels is None else labels[first : first + keep]
        closing = None if closing is None else closing[first : first + keep]
        return Encoded(
            prompt, steps[first : first + keep], kept, n_dropped=len(steps) - keep, first=first, closing=closing
        )

    def _joint(self, prompt_text: str, texts: list[str], where: str) -> tuple[list[int], list[list[int]]]:
        """The whole text tokenised at once, as the kind's reference code does, then cut into the prompt and the steps:
        a token belongs to the piece that holds its last character. The L2R stream is then exactly the reference's
        tokens, and the R2L stream the same step tokens in reverse order."""
        enc = self.tokenizer(prompt_text + "".join(texts), add_special_tokens=False, return_offsets_mapping=True)
        ends = np.cumsum([len(prompt_text), *map(len, texts)])
        last = np.array(
            [end - 1 if end > start else start for start, end in enc["offset_mapping"]]
        )  # a token's last character
        piece = np.searchsorted(ends, last, side="right")
        ids = np.array(enc["input_ids"])
        pieces = [ids[piece == k].tolist() for k in range(len(texts) + 1)]
        if self.template.close:  # read by position, as the card reads it: its tag may merge with the step's end
            self._check_starts(enc["offset_mapping"], ends, where)
            return self.prefix + pieces[0], pieces[1:]
        for t, step in enumerate(pieces[1:]):
            if not step or step[-1] != self.step_tag_id:
                raise DataError(
                    f"{where}: field 'steps': step {t} does not end with the {self.template.kind} tag "
                    f"{self.template.tag!r} once tokenised with the text around it"
                )
        return self.prefix + pieces[0], pieces[1:]

    def _check_starts(self, offsets: list[tuple[int, int]], ends: np.ndarray, where: str) -> None:
        """Every step starts a token of its own: no token runs from the text before it into it. Only then are a
        step's tokens the same whatever comes before it, so both streams' rows and the positions read in them are
        the card's (its tag may still merge with the step's own end, as ".\n\n" does in Qwen's vocabulary)."""
        starts, stops = np.array(offsets).reshape(-1, 2).T
        for t, boundary in enumerate(ends[:-1]):
            if np.any((starts < boundary) & (stops > boundary)):
                raise DataError(
                    f"{where}: field 'steps': step {t} starts inside a token that runs on from the text before it "
                    f"(it begins with a newline?); strip the step's leading newlines"
                )

    def _check_tags(self, prompt: list[int], steps: list[list[int]], where: str) -> None:
        """The tag must occur exactly once per step, at its end; text containing the tag is an error. A kind whose tag
        is ordinary text ("\n") reads it structurally, at each step's last token, so only that is checked."""
        if not self.template.unique_tag:
            return
        ids = prompt + [i for s in steps for i in s]
        found = sum(1 for i in ids if i == self.step_tag_id)
        if found != len(steps):
            raise DataError(
                f"{where}: found {found} step-tag tokens for {len(steps)} steps; "
                "the question or a step contains the step tag text"
            )
