"""The arithmetic that joins the two streams' pooled rows, apart from vLLM so it is tested without it.

Each stream is one prompt: the question, then the steps in the stream's order, each ending
with the step tag (the same token pieces as biprm's Encoder, so both engines see the same
ids). The model returns [value logit (, W1_L·h + b1, W1_R·h)] at every token whose id is the tag,
in the stream's order; the rows at the step pieces' last tokens are kept (`at_step_ends`), the R2L
rows are turned back to forward step order, then the gate is finished and fused.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from biprm.data.encoding import Encoded, stream_order, tag_ends
from biprm.config import MODE_TABLE


def sigmoid(x: np.ndarray) -> np.ndarray:
    """sigmoid in float64 as exp(-log(1 + e^-x)), which does not overflow; the plugin leans on nothing of biprm's
    scoring. Plain numpy, because R2L rows arrive reversed (a negative stride) and torch refuses those."""
    return np.exp(-np.logaddexp(0.0, -np.asarray(x, dtype=np.float64)))


def at_step_ends(rows: np.ndarray, enc: Encoded, stream: str, tag: int) -> np.ndarray:
    """The rows of `stream`'s prompt at each step piece's last token, in the stream's order, from the model's rows at
    every token whose id is `tag`. Where the tag is ordinary text (Skywork's and TRL's "\n", RLHFlow's "\n\n") it
    also occurs inside the question or a step, and only a piece's end is a step tag; for a unique tag all rows are."""
    at_tag = np.flatnonzero(np.asarray(enc.stream(stream)) == tag)
    if len(at_tag) != len(rows):
        raise ValueError(
            f"the model pooled {len(rows)} rows where the {stream} prompt holds {len(at_tag)} step-tag tokens"
        )
    return rows[np.isin(at_tag, tag_ends([len(s) for s in enc.steps], stream, len(enc.prompt)))]


def stream_rows(h: torch.Tensor, value_head: nn.Module, gate: nn.Sequential | None) -> torch.Tensor:
    """[value logit (, W1_L·h + b1, W1_R·h)] per step-tag hidden state h, in fp32; computed where a stream is pooled."""
    h = h.to(torch.float32)
    value = value_head(h)
    if gate is None:
        return value
    first, H = gate[0], h.shape[-1]
    return torch.cat([value, h @ first.weight[:, :H].T + first.bias, h @ first.weight[:, H:].T], dim=-1)


def fuse(
    rows: dict[str, np.ndarray], mode: str, w2: np.ndarray | None = None, b2: float = 0.0
) -> dict[str, np.ndarray | None]:
    """Per-step logits (l2r, r2l, fused) and the gate weight sigma, in forward step order."""
    l2r, r2l = (stream_order(rows[s], s) if s in rows else None for s in ("l2r", "r2l"))
    out = {"l2r": None if l2r is None else l2r[:, 0], "r2l": None if r2l is None else r2l[:, 0], "sigma": None}
    spec = MODE_TABLE[mode]
    if spec.fusion == "gate":
        H = (l2r.shape[1] - 1) // 2
        first = l2r[:, 1 : 1 + H] + r2l[:, 1 + H :]
        out["sigma"] = sigmoid(np.maximum(first, 0) @ w2 + b2)
    elif spec.fusion == "static":
        out["sigma"] = np.full(len(l2r), 0.5)
    if out["sigma"] is None:
        out["fused"] = out[spec.streams[0]]
    else:
        out["fused"] = out["sigma"] * out["l2r"] + (1 - out["sigma"]) * out["r2l"]
    return out
