"""The reference implementation's compute pattern, rebuilt here only as a benchmark baseline.

What it reproduces (GUIDE §2): each stream runs on its own through the causal LM *with*
its LM head, whose full-vocabulary logits are upcast to fp32 as the value-head wrapper
does, and a value head reads the last hidden state. For `bi`, two more `no_grad` passes
fetch the hidden states again for the gate, so a batch costs 4 backbone passes (1 for
`l2r`). Best-of-N scores one candidate at a time. The numbers it computes are the same
kind as BiPRMModel's; only the cost differs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from transformers import PreTrainedModel

from biprm.config import MODE_TABLE
from biprm.data.encoding import Encoded, Encoder
from biprm.data.trajectory import Trajectory
from biprm.losses import objective_loss
from biprm.modeling import BiPRMOutput
from biprm.packing import pack


def reference_inputs(encs: list[Encoded], mode: str, pad_id: int) -> dict[str, dict[str, torch.Tensor]]:
    """One right-padded batch per stream, prompt copied into every row (no sharing, no packing)."""
    return {s: pack(encs, s, share_prefix=False, pad_id=pad_id) for s in MODE_TABLE[mode].streams}


class ReferencePRM(nn.Module):
    """Takes the heads of a BiPRMModel on the same body, so both compute the same scores."""

    def __init__(self, lm: PreTrainedModel, value_head: nn.Module, gate: nn.Module | None = None):
        super().__init__()
        self.lm, self.value_head, self.gate = lm, value_head, gate
        self.mode = "bi" if gate is not None else "l2r"

    def _pass(self, batch: dict[str, torch.Tensor], stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states and value-head logits at the stream's step tags, after a full LM forward."""
        out = self.lm(
            input_ids=batch["input_ids"], attention_mask=(batch["unit_ids"] >= 0).long(), output_hidden_states=True
        )
        out.logits.float()  # the wrapper upcasts the full-vocabulary logits whether or not they are used
        h = out.hidden_states[-1].reshape(-1, out.hidden_states[-1].shape[-1])[batch[f"{stream}_index"]]
        return h, self.value_head(h).squeeze(-1).float()

    def forward(self, l2r: dict[str, torch.Tensor], r2l: dict[str, torch.Tensor] | None = None) -> BiPRMOutput:
        """`l2r` and `r2l` are the per-stream batches of `reference_inputs`; outputs are in forward step order."""
        inputs = {"l2r": l2r, "r2l": r2l} if self.mode == "bi" else {"l2r": l2r}
        values = {s: self._pass(b, s)[1] for s, b in inputs.items()}
        if self.mode == "bi":
            with torch.no_grad():
                h = [self._pass(b, s)[0] for s, b in inputs.items()]
            sigma = torch.sigmoid(self.gate(torch.cat(h, dim=-1)).squeeze(-1))
            fused = sigma * values["l2r"] + (1 - sigma) * values["r2l"]
        else:
            fused = values["l2r"]
        loss = objective_loss("bce", fused, l2r["labels"], l2r["step_offsets"]) if "labels" in l2r else None
        return BiPRMOutput(loss=loss, fused=fused)


@torch.inference_mode()
def score_one_at_a_time(model: ReferencePRM, encoder: Encoder, trajs: list[Trajectory], pad_id: int) -> np.ndarray:
    """Fused step logits, one candidate per call, as the reference scores Best-of-N pools."""
    out = [model(**reference_inputs([encoder.encode(t)], model.mode, pad_id)).fused for t in trajs]
    return torch.cat(out).double().numpy()
