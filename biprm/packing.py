"""Encoded trajectories -> one packed batch that runs both streams in a single forward pass.

Layout. A *unit* is one prompt (the shared prefix, stream id 0) followed by several
*continuations* (stream ids 1, 2, ...): the L2R steps and the R2L steps of one
trajectory, or of every candidate that shares the question. A token sees the tokens
before it in its own unit that belong to the prefix or to its own continuation, and
its position id continues after the prefix, so every continuation computes exactly
what it would compute after its own copy of the prompt. Without prefix sharing the
prompt is copied into each continuation and the prefix is empty. Units are laid
into rows of at most `max_tokens` tokens (padding-free packing); rows are padded to
the longest one.

The tag positions are computed from the layout, then checked by token id against the
final `input_ids` (see `check_tags`). R2L outputs are re-aligned to forward order by
index: `r2l_index[n]` is the tag of the same step as `l2r_index[n]`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from biprm.encoding import Encoded

STREAMS = {"l2r": ("l2r",), "r2l": ("r2l",), "bi": ("l2r", "r2l"), "bi-static": ("l2r", "r2l")}


@dataclass
class _Unit:
    prefix: list[int]
    conts: list[tuple[int, str]] = field(default_factory=list)  # (trajectory index, stream)
    n_tokens: int = 0


def _continuation(enc: Encoded, stream: str, shared: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of one stream after the prefix, and the offset of each step's tag (forward order)."""
    order = enc.steps if stream == "l2r" else enc.steps[::-1]
    head = [] if shared else enc.prompt
    ids = np.array(head + [i for s in order for i in s], dtype=np.int64)
    ends = len(head) + np.cumsum([len(s) for s in order]) - 1
    return ids, ends if stream == "l2r" else ends[::-1]


def _units(encs: list[Encoded], streams: tuple[str, ...], share_prefix: bool, max_tokens: int | None) -> list[_Unit]:
    """With sharing, trajectories with the same prompt share one unit; without, every stream is its own unit."""
    if not share_prefix:
        return [_Unit([], [(i, s)], e.n_tokens) for i, e in enumerate(encs) for s in streams]
    units: list[_Unit] = []
    open_unit: dict[tuple[int, ...], _Unit] = {}
    for i, enc in enumerate(encs):
        need = (enc.n_tokens - len(enc.prompt)) * len(streams)
        unit = open_unit.get(tuple(enc.prompt))
        if unit is None or (max_tokens is not None and unit.n_tokens + need > max_tokens):
            unit = _Unit(list(enc.prompt), n_tokens=len(enc.prompt))
            units.append(unit)
            open_unit[tuple(enc.prompt)] = unit
        unit.conts.extend((i, s) for s in streams)
        unit.n_tokens += need
    return units


def _rows(units: list[_Unit], max_tokens: int | None) -> list[list[int]]:
    """First-fit-decreasing bin packing of units into rows; one unit per row when max_tokens is None."""
    if max_tokens is None:
        return [[u] for u in range(len(units))]
    rows: list[list[int]] = []
    room: list[int] = []
    for u in sorted(range(len(units)), key=lambda u: -units[u].n_tokens):
        size = units[u].n_tokens
        slot = next((r for r, free in enumerate(room) if free >= size), None)
        if slot is None:
            rows.append([u])
            room.append(max_tokens - size)
        else:
            rows[slot].append(u)
            room[slot] -= size
    return rows


def pack(
    encs: list[Encoded],
    mode: str = "bi",
    share_prefix: bool = True,
    max_tokens: int | None = None,
    pad_id: int = 0,
) -> dict[str, torch.Tensor]:
    """Build the model inputs for `encs` (see module docstring for the layout)."""
    streams = STREAMS[mode]
    units = _units(encs, streams, share_prefix, max_tokens)
    rows = _rows(units, max_tokens)
    width = max(sum(units[u].n_tokens for u in row) for row in rows)
    R = len(rows)
    input_ids = np.full((R, width), pad_id, dtype=np.int64)
    position_ids = np.zeros((R, width), dtype=np.int64)
    unit_ids = np.full((R, width), -1, dtype=np.int64)
    stream_ids = np.full((R, width), -1, dtype=np.int64)
    tag_index = {s: [None] * len(encs) for s in streams}
    for r, row in enumerate(rows):
        col = 0
        for u in row:
            unit = units[u]
            P = len(unit.prefix)
            input_ids[r, col : col + P] = unit.prefix
            position_ids[r, col : col + P] = np.arange(P)
            unit_ids[r, col : col + P] = u
            stream_ids[r, col : col + P] = 0
            col += P
            for k, (i, stream) in enumerate(unit.conts, start=1):
                ids, ends = _continuation(encs[i], stream, share_prefix)
                n = len(ids)
                input_ids[r, col : col + n] = ids
                position_ids[r, col : col + n] = np.arange(P, P + n)
                unit_ids[r, col : col + n] = u
                stream_ids[r, col : col + n] = k
                tag_index[stream][i] = r * width + col + ends
                col += n
    n_steps = [len(e.steps) for e in encs]
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(position_ids),
        "unit_ids": torch.from_numpy(unit_ids),
        "stream_ids": torch.from_numpy(stream_ids),
        "step_offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(n_steps)]).astype(np.int64)),
    }
    for stream in streams:
        batch[f"{stream}_index"] = torch.from_numpy(np.concatenate(tag_index[stream]).astype(np.int64))
    if all(e.labels is not None for e in encs):
        batch["labels"] = torch.tensor([y for e in encs for y in e.labels], dtype=torch.float32)
    return batch


def check_tags(batch: dict[str, torch.Tensor], step_tag_id: int) -> None:
    """Every indexed position holds the tag id and no tag is left unindexed."""
    flat = batch["input_ids"].reshape(-1)
    n_tags = int((flat == step_tag_id).sum())
    for key in ("l2r_index", "r2l_index"):
        if key in batch:
            index = batch[key]
            if not bool((flat[index] == step_tag_id).all()):
                raise AssertionError(f"{key} points at a token that is not the step tag")
    n_indexed = sum(len(batch[k]) for k in ("l2r_index", "r2l_index") if k in batch)
    if n_tags != n_indexed:
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
