"""Step scores -> per-token process rewards, for PPO-style trainers that take a reward per token.

Each step's score goes on the policy token where that step's text ends; every other
token gets 0. Steps are found in the completion text in order, so the rule that cut
the text into steps must be the one that produced `steps` (e.g. `split_steps`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np


def step_end_chars(text: str, steps: Sequence[str]) -> list[int]:
    """Character offset just past each step in `text` (steps are searched left to right)."""
    ends, at = [], 0
    for k, step in enumerate(steps):
        start = text.find(step, at)
        if start < 0:
            raise ValueError(f"step {k} ({step[:40]!r}) is not in the completion text after offset {at}")
        at = start + len(step)
        ends.append(at)
    return ends


def step_end_tokens(offsets: Sequence[tuple[int, int]], ends: Sequence[int]) -> list[int]:
    """Index of the token that holds the last character of each step, from the tokenizer's offset mapping."""
    token_ends = np.maximum.accumulate(
        [e for _, e in offsets]
    )  # special tokens are (0, 0): they end where the last text did
    index = np.searchsorted(token_ends, np.asarray(ends) - 1, side="right")
    if len(ends) and index.max() >= len(offsets):
        raise ValueError("a step ends past the last token: the offsets do not cover the completion text")
    return index.tolist()


def decoded_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of a policy's own tokens and each token's (start, end) characters in it.

    Offsets come from decoding `ids`, not from tokenizing the text again: a sampled sequence
    need not be the tokenizer's encoding of its own text. Tokens decoded one by one give the
    offsets when their pieces add up to the text (the common case); a character split over
    tokens (byte fallback) does not, and then every prefix is decoded (quadratic), a token
    ending where its prefix's decoded text stops agreeing with the text (a partial character
    decodes to a replacement character, not yet to its own).
    Special tokens decode to nothing, as in the text a trainer hands its reward functions.
    """
    text = tokenizer.decode(ids, skip_special_tokens=True)
    pieces = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True)
    if "".join(pieces) == text:
        ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
    else:
        prefixes = tokenizer.batch_decode([ids[: k + 1] for k in range(len(ids))], skip_special_tokens=True)
        ends = np.array([len(os.path.commonprefix([p, text])) for p in prefixes], dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
    return text, list(zip(starts.tolist(), ends.tolist()))


def stream_scores(row: dict, stream: str) -> list[float]:
    """One stream's step scores from a score row (`biprm score`'s or the server's); a stream the model lacks is an
    error."""
    if row.get(stream) is None:
        raise LookupError(f"stream {stream!r}: the reward model does not output it (its score rows have it null)")
    return row[stream]


def placed_step_rewards(
    text: str, steps: Sequence[str], scores: Sequence[float], offsets: Sequence[tuple[int, int]]
) -> tuple[list[int], list[float]]:
    """(token ending each scored step, that step's score). A scorer may return fewer scores than
    steps (steps past its max_length); only those steps are placed."""
    placed = step_end_tokens(offsets, step_end_chars(text, steps)[: len(scores)])
    return placed, [float(x) for x in scores[: len(placed)]]


def token_rewards(
    text: str, steps: Sequence[str], scores: Sequence[float], offsets: Sequence[tuple[int, int]]
) -> np.ndarray:
    """Per-token rewards for a completion: scores[k] on the token ending step k, 0 elsewhere.

    `offsets` are the (start, end) characters of the completion's tokens, as
    `tokenizer(text, return_offsets_mapping=True)["offset_mapping"]` gives them.
    """
    out = np.zeros(len(offsets))
    placed, values = placed_step_rewards(text, steps, scores, offsets)
    out[placed] = values
    return out
