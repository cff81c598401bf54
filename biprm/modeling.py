"""BiPRM: one backbone, one value head shared by both streams, and a per-step gate.

    r_t^L2R = v(h_t^L2R),  r_t^R2L = v(h_t^R2L)                 (logits)
    sigma_t = sigmoid(MLP([h_t^L2R; h_t^R2L])),  MLP = Linear(2H,H) -> ReLU -> Linear(H,1)
    r_t     = sigma_t * r_t^L2R + (1 - sigma_t) * r_t^R2L        (fused in logit space)

Both streams are rows (or packed segments) of ONE batch, so the backbone runs once
per step whatever the mode. The backbone is the causal LM's body (AutoModel): no LM
head and no vocabulary-sized logits are ever computed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from transformers import AutoConfig, AutoModel, PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from biprm.encoding import add_step_tag
from biprm.losses import objective_loss
from biprm.packing import STREAMS, attention_mask

MODES = tuple(STREAMS)


class BiPRMConfig(PreTrainedConfig):
    model_type = "biprm"
    sub_configs = {"backbone_config": AutoConfig}

    def __init__(
        self,
        backbone_config: dict | PreTrainedConfig | None = None,
        mode: str = "bi",
        objective: str = "bce",
        zeta: float = 4.0,
        step_tag_id: int | None = None,
        detach_gate_inputs: bool = True,
        aux_loss_weight: float = 0.0,
        **kwargs,
    ):
        if isinstance(backbone_config, dict):
            backbone_config = AutoConfig.for_model(**backbone_config)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.backbone_config = backbone_config
        self.mode = mode
        self.objective = objective
        self.zeta = zeta
        self.step_tag_id = step_tag_id
        self.detach_gate_inputs = detach_gate_inputs
        self.aux_loss_weight = aux_loss_weight
        super().__init__(**kwargs)


@dataclass
class BiPRMOutput(ModelOutput):
    """Per-step logits in forward step order, flat over the batch (see `step_offsets`)."""

    loss: torch.Tensor | None = None
    fused: torch.Tensor | None = None
    l2r: torch.Tensor | None = None
    r2l: torch.Tensor | None = None
    sigma: torch.Tensor | None = None


class BiPRMModel(PreTrainedModel):
    config_class = BiPRMConfig
    base_model_prefix = "biprm"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = False

    def __init__(self, config: BiPRMConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        if config._attn_implementation not in (None, "sdpa", "eager"):
            raise ValueError("BiPRM packs streams with a custom attention mask: use attn_implementation 'sdpa' or 'eager'")
        self.backbone = backbone if backbone is not None else AutoModel.from_config(config.backbone_config)
        H = config.backbone_config.hidden_size
        self.value_head = nn.Linear(H, 1)
        self.gate = nn.Sequential(nn.Linear(2 * H, H), nn.ReLU(), nn.Linear(H, 1)) if config.mode == "bi" else None
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Only the heads are ours to initialise; the backbone keeps its own scheme."""
        if module is self.value_head or (self.gate is not None and module in self.gate):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    @property
    def streams(self) -> tuple[str, ...]:
        return STREAMS[self.config.mode]

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        unit_ids: torch.Tensor,
        stream_ids: torch.Tensor,
        step_offsets: torch.Tensor,
        l2r_index: torch.Tensor | None = None,
        r2l_index: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> BiPRMOutput:
        mask = attention_mask(unit_ids, stream_ids)
        if mask is not None and self.backbone.config._attn_implementation == "eager":  # eager adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill(~mask, torch.finfo(self.dtype).min)
        hidden = self.backbone(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False).last_hidden_state
        flat = hidden.reshape(-1, hidden.shape[-1])
        h_l2r = flat[l2r_index] if l2r_index is not None else None
        h_r2l = flat[r2l_index] if r2l_index is not None else None
        r_l2r = self.value_head(h_l2r).squeeze(-1) if h_l2r is not None else None
        r_r2l = self.value_head(h_r2l).squeeze(-1) if h_r2l is not None else None
        sigma = self._sigma(h_l2r, h_r2l)
        if sigma is None:
            fused = r_l2r if r_l2r is not None else r_r2l
        else:
            fused = sigma * r_l2r + (1 - sigma) * r_r2l
        loss = None
        if labels is not None:
            cfg = self.config
            loss = objective_loss(cfg.objective, fused, labels, step_offsets, cfg.zeta)
            if cfg.aux_loss_weight and sigma is not None:
                aux = objective_loss(cfg.objective, r_l2r, labels, step_offsets, cfg.zeta)
                aux = aux + objective_loss(cfg.objective, r_r2l, labels, step_offsets, cfg.zeta)
                loss = loss + cfg.aux_loss_weight * aux
        return BiPRMOutput(loss=loss, fused=fused, l2r=r_l2r, r2l=r_r2l, sigma=sigma)

    def _sigma(self, h_l2r: torch.Tensor | None, h_r2l: torch.Tensor | None) -> torch.Tensor | None:
        """Gate weight on the L2R stream: learned for `bi`, 0.5 for `bi-static`, none for one stream."""
        if self.config.mode == "bi-static":
            return torch.full(h_l2r.shape[:1], 0.5, dtype=h_l2r.dtype, device=h_l2r.device)
        if self.gate is None:
            return None
        gate_in = torch.cat([h_l2r, h_r2l], dim=-1)
        if self.config.detach_gate_inputs:
            gate_in = gate_in.detach()
        return torch.sigmoid(self.gate(gate_in).squeeze(-1))


def from_backbone(
    path: str,
    tokenizer,
    mode: str = "bi",
    objective: str = "bce",
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    **config_kwargs,
) -> BiPRMModel:
    """A fresh BiPRM on a pretrained body; adds the step tag to `tokenizer` and resizes embeddings."""
    backbone = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    step_tag_id = add_step_tag(tokenizer)
    if len(tokenizer) > backbone.get_input_embeddings().num_embeddings:
        backbone.resize_token_embeddings(len(tokenizer))
    config = BiPRMConfig(
        backbone_config=backbone.config, mode=mode, objective=objective, step_tag_id=step_tag_id, **config_kwargs
    )
    model = BiPRMModel(config, backbone=backbone).to(dtype)
    model.set_attn_implementation(attn_implementation)  # wrapping resets the body's setting
    return model


AutoConfig.register("biprm", BiPRMConfig)
AutoModel.register(BiPRMConfig, BiPRMModel)
