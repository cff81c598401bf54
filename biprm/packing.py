"""Encoded trajectories -> packed batches that run both streams together.

Layout. A *unit* is one prompt (the shared prefix, stream id 0) followed by several
*continuations* (stream ids 1, 2, ...): the L2R steps and the R2L steps of one
trajectory, or of every candidate that shares the question. A token sees the tokens
before it in its own unit that belong to the prefix or to its own continuation, and
its position id continues after the prefix, so every continuation computes exactly
what it would compute after its own copy of the prompt. Without prefix sharing the
prompt is copied into each continuation and the prefix is empty. Units are laid
into rows of at most `max_tokens` tokens (padding-free packing); rows are padded to
the longest one, and padding continues the position ids of the row's last sequence so
a row holding one sequence still looks like one sequence to the backbone.

`pack` builds the one-pass layout. `pack_cached` builds the prefix-cache layout for
Best-of-N: each distinct prompt once in `prefix_ids`, run first, then one continuation
per row, longest first, run in chunks that attend to their prompt through its KV
cache. That costs one backbone call for the prompts plus one per chunk, but padding
stays small and attention stays linear in the number of candidates per prompt.

The tag positions are computed from the layout, then checked by token id against the
final `input_ids` (see `check_tags`). R2L outputs are re-aligned to forward order by
index: `r2l_index[n]` is the tag of the same step as `l2r_index[n]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from biprm.config import DENSE_MAX, MODE_TABLE
from biprm.data.encoding import Encoded, tag_ends
from biprm.offsets import offsets_of


@dataclass
class _Unit:
    prefix: list[int]
    conts: list[tuple[int, str]] = field(default_factory=list)  # (trajectory index, stream)
    n_tokens: int = 0


class _Segment(NamedTuple):
    """A run of tokens in a row; `traj` >= 0 marks a continuation whose step tags end at `ends`."""

    ids: np.ndarray
    start: int  # position id of the first token
    unit: int
    stream_id: int
    traj: int = -1
    stream: str = ""
    ends: np.ndarray | None = None


def continuation(enc: Encoded, stream: str, shared: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of one stream after the prefix, and the offset of each step's tag (forward order)."""
    head = [] if shared else enc.prompt
    ids = np.array(head + enc.continuation(stream), dtype=np.int64)
    return ids, tag_ends([len(s) for s in enc.steps], stream, len(head))


def _units(encs: list[Encoded], streams: tuple[str, ...], share_prefix: bool, max_tokens: int | None) -> list[_Unit]:
    """With sharing, trajectories with the same prompt share one unit; without, every stream is its own unit.

    A trajectory whose shared tree would not fit in `max_tokens` gets plain units too: the
    masked attention over its long row costs more than the prompt copies it saves.
    """
    plain = lambda i: [_Unit([], [(i, s)], encs[i].n_tokens) for s in streams]  # noqa: E731
    if not share_prefix:
        return [u for i in range(len(encs)) for u in plain(i)]
    units: list[_Unit] = []
    open_unit: dict[tuple[int, ...], _Unit] = {}
    for i, enc in enumerate(encs):
        need = (enc.n_tokens - len(enc.prompt)) * len(streams)
        if max_tokens is not None and len(streams) > 1 and len(enc.prompt) + need > max_tokens:
            units += plain(i)
            continue
        unit = open_unit.get(tuple(enc.prompt))
        if unit is None or (max_tokens is not None and unit.n_tokens + need > max_tokens):
            unit = _Unit(list(enc.prompt), n_tokens=len(enc.prompt))
            units.append(unit)
            open_unit[tuple(enc.prompt)] = unit
        unit.conts.extend((i, s) for s in streams)
        unit.n_tokens += need
    return units


def token_runs(sizes: Sequence[int], budget: int | None, padded: bool = True, start: int = 0) -> list[tuple[int, int]]:
    """[a, b) runs of consecutive items from `start`, each within `budget` tokens and at least one item long;
    None: one run. A run costs its items times its widest item when `padded` (rows padded to one width), else
    the sum of its sizes (real tokens). Callers sort the items by length first, so little is padding.

    The one batching rule of scoring, the prompt cache's calls and the trunk cache (build, scoring, micro-batches).
    `_bins` is the other shape: it fills rows with units in any order, which consecutive runs cannot."""
    runs, a, used, widest = [], start, 0, 0
    for b in range(start, len(sizes)):
        used, widest = used + sizes[b], max(widest, sizes[b])
        if b > a and budget is not None and ((b - a + 1) * widest if padded else used) > budget:
            runs.append((a, b))
            a, used, widest = b, sizes[b], sizes[b]
    return runs + [(a, len(sizes))] if a < len(sizes) else runs


def _bins(sizes: list[int], capacity: int | None) -> list[list[int]]:
    """First-fit-decreasing bin packing of item indices; one item per bin when capacity is None. Units of
    every length share a row here, so a row is filled by whatever fits its gap, not by the next in order."""
    if capacity is None:
        return [[k] for k in range(len(sizes))]
    bins: list[list[int]] = []
    room: list[int] = []
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        slot = next((b for b, free in enumerate(room) if free >= sizes[k]), None)
        if slot is None:
            bins.append([k])
            room.append(capacity - sizes[k])
        else:
            bins[slot].append(k)
            room[slot] -= sizes[k]
    return bins


def _layout(
    rows: list[list[_Segment]], encs: list[Encoded], streams: tuple[str, ...], pad_id: int
) -> dict[str, torch.Tensor]:
    """Write the segments of every row into padded [R, L] arrays and collect the tag indices."""
    width = max(sum(len(s.ids) for s in row) for row in rows)
    R = len(rows)
    input_ids = np.full((R, width), pad_id, dtype=np.int64)
    position_ids = np.zeros((R, width), dtype=np.int64)
    unit_ids = np.full((R, width), -1, dtype=np.int64)
    stream_ids = np.full((R, width), -1, dtype=np.int64)
    tag_index = {s: [None] * len(encs) for s in streams}
    for r, row in enumerate(rows):
        col = 0
        for seg in row:
            n = len(seg.ids)
            input_ids[r, col : col + n] = seg.ids
            position_ids[r, col : col + n] = np.arange(seg.start, seg.start + n)
            unit_ids[r, col : col + n] = seg.unit
            stream_ids[r, col : col + n] = seg.stream_id
            if seg.traj >= 0:
                tag_index[seg.stream][seg.traj] = r * width + col + seg.ends
            col += n
        last = position_ids[r, col - 1] + 1
        position_ids[r, col:] = np.arange(last, last + width - col)
    n_steps = [len(e.steps) for e in encs]
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(position_ids),
        "unit_ids": torch.from_numpy(unit_ids),
        "stream_ids": torch.from_numpy(stream_ids),
        "step_offsets": torch.from_numpy(offsets_of(n_steps)),
    }
    for stream in streams:
        batch[f"{stream}_index"] = torch.from_numpy(np.concatenate(tag_index[stream]).astype(np.int64))
    if all(e.labels is not None for e in encs):
        batch["labels"] = torch.tensor([y for e in encs for y in e.labels], dtype=torch.float32)
    return batch


def pack(
    encs: list[Encoded],
    mode: str = "bi",
    share_prefix: bool = True,
    max_tokens: int | None = None,
    pad_id: int = 0,
    dense_max: int | None = DENSE_MAX,
) -> dict[str, torch.Tensor]:
    """Build the one-pass model inputs for `encs` (see module docstring for the layout). Where a trajectory's unit
    would pass `dense_max` tokens, every stream of the batch gets a plain row of its own: no L x L mask is built
    (`attention_mask` gives None), so attention memory grows linearly with length. None: the layout asked for."""
    streams = MODE_TABLE[mode].streams
    if dense_max is not None and encs and _widest(encs, len(streams), share_prefix) > dense_max:
        share_prefix, max_tokens = False, None
    units = _units(encs, streams, share_prefix, max_tokens)
    sizes = [u.n_tokens for u in units]
    rows = []
    for row in _bins(
        sizes, None if max_tokens is None else max(max_tokens, max(sizes))
    ):  # rows are padded to the widest
        segments = []
        for u in row:
            unit = units[u]
            P = len(unit.prefix)
            if P:  # a prompt with one continuation is just the start of one plain sequence
                segments.append(_Segment(np.array(unit.prefix, dtype=np.int64), 0, u, 0 if len(unit.conts) > 1 else 1))
            for k, (i, stream) in enumerate(unit.conts, start=1):
                ids, ends = continuation(encs[i], stream, shared=P > 0)
                segments.append(_Segment(ids, P, u, k, i, stream, ends))
        rows.append(segments)
    return _layout(rows, encs, streams, pad_id)


def _widest(encs: list[Encoded], n_streams: int, shared: bool) -> int:
    """Tokens of the largest unit: a trajectory's prompt and all its continuations, or one stream."""
    return max(len(e.prompt) + n_streams * (e.n_tokens - len(e.prompt)) if shared else e.n_tokens for e in encs)


def pack_cached(
    encs: list[Encoded], mode: str = "bi", max_tokens: int | None = None, pad_id: int = 0
) -> dict[str, torch.Tensor]:
    """Prefix-cache layout: `prefix_ids` [Q, P] holds each distinct prompt once (right-padded,
    lengths in `prefix_lengths`); row r holds one continuation, extending prompt
    `prefix_rows[r]`. Rows are sorted longest first and cut into `chunks` (row boundaries)
    of at most `max_tokens` tokens counted at each chunk's widest row; None: one chunk."""
    streams = MODE_TABLE[mode].streams
    prompts: dict[tuple[int, ...], int] = {}
    conts: list[tuple[int, _Segment]] = []
    for i, enc in enumerate(encs):
        q = prompts.setdefault(tuple(enc.prompt), len(prompts))
        for stream in streams:
            ids, ends = continuation(enc, stream, shared=True)
            conts.append((q, _Segment(ids, len(enc.prompt), 0, 1, i, stream, ends)))
    conts.sort(key=lambda c: -len(c[1].ids))
    batch = _layout([[seg] for _, seg in conts], encs, streams, pad_id)
    del batch["stream_ids"]  # one continuation per row: the unit ids say all
    widths = [len(seg.ids) for _, seg in conts]
    chunks = [a for a, _ in token_runs(widths, max_tokens)] + [len(widths)]
    lengths = [len(p) for p in prompts]
    prefix_ids = np.full((len(prompts), max(lengths)), pad_id, dtype=np.int64)
    for prompt, q in prompts.items():
        prefix_ids[q, : len(prompt)] = prompt
    batch["prefix_ids"] = torch.from_numpy(prefix_ids)
    batch["prefix_lengths"] = torch.tensor(lengths, dtype=torch.int64)
    batch["prefix_rows"] = torch.tensor([q for q, _ in conts], dtype=torch.int64)
    batch["chunks"] = torch.tensor(chunks, dtype=torch.int64)
    return batch


def check_tags(batch: dict[str, torch.Tensor], step_tag_id: int, unique: bool = True) -> None:
    """Every indexed position holds the tag id and, where the tag is `unique` to step ends, no tag is left unindexed."""
    flat = batch["input_ids"].reshape(-1)
    n_tags = int((flat == step_tag_id).sum())
    for key in ("l2r_index", "r2l_index"):
        if key in batch:
            index = batch[key]
            if not bool((flat[index] == step_tag_id).all()):
                raise AssertionError(f"{key} points at a token that is not the step tag")
    n_indexed = sum(len(batch[k]) for k in ("l2r_index", "r2l_index") if k in batch)
    if unique and n_tags != n_indexed:
        raise AssertionError(f"{n_tags} step tags in input_ids but {n_indexed} indexed steps")


def attention_mask(unit_ids: torch.Tensor, stream_ids: torch.Tensor) -> torch.Tensor | None:
    """[R, 1, L, L] boolean mask: same unit, causal, and prefix-or-own-continuation.

    None when every row holds one plain sequence (no sharing, no packing): right padding
    under a causal mask is then invisible to real tokens, and the backbone can use its
    fastest causal attention kernel.
    """
    one_per_row = bool(((unit_ids == unit_ids[:, :1]) | (unit_ids < 0)).all()) and int(stream_ids.max()) == 1
    if one_per_row and not bool((stream_ids == 0).any()):
        return None
    L = unit_ids.shape[1]
    same_unit = unit_ids[:, :, None] == unit_ids[:, None, :]
    key_stream = stream_ids[:, None, :]
    visible = (key_stream == 0) | (key_stream == stream_ids[:, :, None])
    causal = torch.ones(L, L, dtype=torch.bool, device=unit_ids.device).tril()
    return (same_unit & visible & causal)[:, None]


def cached_attention_mask(unit_ids: torch.Tensor, prefix_lengths: torch.Tensor, n_cached: int) -> torch.Tensor:
    """[R, 1, L, n_cached + L] boolean mask for continuation rows of `pack_cached`: the row's
    own prompt in the cache (its first `prefix_lengths[r]` entries), then causal attention
    within the row (padding sees only padding)."""
    L = unit_ids.shape[1]
    prompt = torch.arange(n_cached, device=unit_ids.device) < prefix_lengths[:, None]
    causal = torch.ones(L, L, dtype=torch.bool, device=unit_ids.device).tril()
    own = (unit_ids[:, :, None] == unit_ids[:, None, :]) & causal
    return torch.cat([prompt[:, None, :].expand(-1, L, -1), own], dim=-1)[:, None]
