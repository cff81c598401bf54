"""BiPRM: one backbone, one value head shared by both streams, and a per-step gate.

    r_t^L2R = v(h_t^L2R),  r_t^R2L = v(h_t^R2L)                 (logits)
    sigma_t = sigmoid(MLP([h_t^L2R; h_t^R2L])),  MLP = Linear(2H,H) -> ReLU -> Linear(H,1)
    r_t     = sigma_t * r_t^L2R + (1 - sigma_t) * r_t^R2L        (fused in logit space)

Both streams are rows (or packed segments) of ONE batch, so the backbone runs once
per step whatever the mode (twice with a prompt KV cache: prompts, then continuations).
The backbone is the causal LM's body (AutoModel): no LM head and no vocabulary-sized
logits are ever computed.
"""

from __future__ import annotations

import copy
import inspect
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    DynamicCache,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import ModelOutput

from biprm.config import ATTENTION, MODE_TABLE, MODES
from biprm.data.encoding import Encoder, add_step_tag
from biprm.data.template import TEMPLATES
from biprm.losses import objective_loss
from biprm.packing import attention_mask, cached_attention_mask
from biprm.folder import ModelFolder, resolve
from biprm.prms import UnknownPRM, read_out

HEADS = ("value_head.", "gate.")  # the state-dict prefixes of the parts biprm adds to the body
PEFT_PREFIX = "base_model.model."  # where a LoRA model (a PeftModel) holds the BiPRMModel's parameters


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
        # the paper trains the gate through both streams; True stops its gradient into them
        detach_gate_inputs: bool = False,
        aux_loss_weight: float = 0.0,
        prm_kind: str = "biprm",  # whose template and read-out (biprm.prms): a PRM made bidirectional keeps its own
        # "linear": Linear(H, 1); "mlp": Linear(H, H) -> ReLU -> Linear(H, 1) (Qwen's PRM head)
        value_head: str = "linear",
        gate_init: float | None = None,  # None: a random gate; a number x: sigma starts at sigmoid(x) on every step
        # how its training steps were cut (biprm.data.segment): the default for scoring a trace
        segmenter: str = "given",
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
        self.prm_kind = prm_kind
        self.value_head = value_head
        self.gate_init = gate_init
        self.segmenter = segmenter
        super().__init__(**kwargs)

    @property
    def hidden_size(self) -> int:
        """The backbone's width, where engines look for it: DeepSpeed's ZeRO-3 "auto" buckets read `config.hidden_size`,
        and refuse to start on a config without it (the paper's recipe did, on its first GPU)."""
        return self.backbone_config.hidden_size

    @hidden_size.setter
    def hidden_size(self, value: int) -> None:
        """A config.json that holds the width (a tool wrote it out) loads; one that disagrees with its backbone is
        refused."""
        if value != self.backbone_config.hidden_size:
            raise ValueError(f"hidden_size {value} differs from the backbone's {self.backbone_config.hidden_size}")


class Float32Linear(nn.Linear):
    """A linear layer that computes in fp32 whatever dtype an engine casts its weights to.

    DeepSpeed's bf16 mode and FSDP's mixed precision cast every weight to bf16, and autocast
    would run the product in bf16: a bf16 logit near 10 moves in steps of 0.06, which ties
    Best-of-N candidates and rounds the gate. Called as a module, so ZeRO-3 still gathers
    the weights in its hooks before `forward` runs.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), self.weight.float(), bias)


def head_masters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The heads' fp32 master weights from a DeepSpeed optimizer, by state-dict name, on the CPU. DeepSpeed's bf16 mode
    keeps bf16 copies in the module, and a save gathers those: a head saved from them is rounded to bf16. Under ZeRO-3
    the masters are partitioned, so every rank must call this (in the same order) for the gather. A LoRA model's heads
    are found under PEFT's prefix, and named with it, as its checkpoints' state dicts name them."""
    from deepspeed.utils import safe_get_full_fp32_param

    found = {
        name: safe_get_full_fp32_param(p)
        for name, p in model.named_parameters()
        if name.removeprefix(PEFT_PREFIX).startswith(HEADS) and p.requires_grad
    }
    return {name: master.detach().cpu() for name, master in found.items() if master is not None}


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
    _keep_in_fp32_modules_strict = [r"^value_head\.", r"^gate\."]  # loaded in bf16, the heads stay fp32 (see `heads`)

    def __init__(self, config: BiPRMConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        check_attention(config._attn_implementation)
        self.backbone = backbone if backbone is not None else AutoModel.from_config(config.backbone_config)
        H = config.backbone_config.hidden_size
        self.value_head = (
            Float32Linear(H, 1)
            if config.value_head == "linear"
            else nn.Sequential(Float32Linear(H, H), nn.ReLU(), Float32Linear(H, 1))
        )
        self.gate = (
            nn.Sequential(Float32Linear(2 * H, H), nn.ReLU(), Float32Linear(H, 1))
            if MODE_TABLE[config.mode].fusion == "gate"
            else None
        )
        self.post_init()

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *args, prm_kind: str | None = None, prm_mode: str | None = None, **kwargs
    ) -> "BiPRMModel":
        """transformers' loader, after `biprm.folder.resolve`: a wrong local folder is named in one line, a missing one
        never goes to the Hub. A folder of another PRM kind (biprm.prms; detected, or named by `prm_kind`) loads through
        `from_prm`, in `prm_mode` (l2r: as shipped; bi-static or r2l: also, or only, reading its steps reversed,
        untrained)."""
        folder = pretrained_model_name_or_path
        folder = folder if isinstance(folder, ModelFolder) else resolve(folder, prm_kind, prm_mode)
        if folder.trained_elsewhere:
            return from_prm(folder, **kwargs)
        return super().from_pretrained(folder.path, *args, **kwargs)

    def save_pretrained(self, save_directory, *args, state_dict: dict | None = None, **kwargs) -> None:
        """transformers' save, with the heads in fp32 whatever an engine cast them to: a ZeRO-3
        16-bit save gathers bf16 copies of them, and a bf16-cast model holds bf16 ones."""
        state_dict = self.state_dict() if state_dict is None else state_dict
        state_dict = {
            k: v.float() if k.startswith(HEADS) and v.is_floating_point() else v for k, v in state_dict.items()
        }
        super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        """Only the heads are ours to initialise; the backbone keeps its own scheme. With `gate_init` the gate's last
        layer starts at zero weight and that bias, so sigma starts at sigmoid(gate_init) on every step."""
        heads = [self.value_head] + ([self.gate] if self.gate is not None else [])
        if isinstance(module, nn.Linear) and any(module is h or module in h.modules() for h in heads):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
            if self.config.gate_init is not None and self.gate is not None and module is self.gate[-1]:
                nn.init.zeros_(module.weight)
                nn.init.constant_(module.bias, self.config.gate_init)

    @property
    def streams(self) -> tuple[str, ...]:
        return MODE_TABLE[self.config.mode].streams

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
        """The packed layout of `pack`: both streams of every trajectory in one backbone call (what the Trainer
        calls)."""
        tags = self.tag_states(input_ids, position_ids, unit_ids, stream_ids, l2r_index, r2l_index)
        return self._heads_on(tags, l2r_index, r2l_index, step_offsets, labels)

    def tag_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        unit_ids: torch.Tensor,
        stream_ids: torch.Tensor,
        l2r_index: torch.Tensor | None = None,
        r2l_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The body's hidden states at the step tags of `pack`'s layout: the L2R tags, then the R2L ones, each in
        forward step order. Apart from `forward`, a scorer that reads a long trajectory's streams in different windows
        calls it."""
        mask = self._for_backend(attention_mask(unit_ids, stream_ids))
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return hidden.reshape(-1, hidden.shape[-1])[torch.cat([i for i in (l2r_index, r2l_index) if i is not None])]

    def score_with_prefix(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        unit_ids: torch.Tensor,
        step_offsets: torch.Tensor,
        prefix_ids: torch.Tensor,
        prefix_lengths: torch.Tensor,
        prefix_rows: torch.Tensor,
        chunks: torch.Tensor,
        l2r_index: torch.Tensor | None = None,
        r2l_index: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> BiPRMOutput:
        """The prefix-cache layout of `pack_cached` (Best-of-N inference): prompts once, then continuations on their KV
        cache."""
        flat_index = torch.cat([i for i in (l2r_index, r2l_index) if i is not None])
        tags = self._cached_tags(
            input_ids, position_ids, unit_ids, prefix_ids, prefix_lengths, prefix_rows, chunks, flat_index
        )
        return self._heads_on(tags, l2r_index, r2l_index, step_offsets, labels)

    def forward_features(
        self,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        step_offsets: torch.Tensor,
        top_layers: int,
        l2r_index: torch.Tensor | None = None,
        r2l_index: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> BiPRMOutput:
        """The trunk-cache layout of `TrunkCache.batch`: the top `top_layers` layers on cached bottom-layer
        features (plain causal rows, one per stream), then the same heads."""
        top = split(self, top_layers)[1]
        hidden = top(
            inputs_embeds=features.to(self.dtype), position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self._at_tags(hidden, l2r_index, r2l_index, step_offsets, labels)

    def _at_tags(
        self,
        hidden: torch.Tensor,
        l2r_index: torch.Tensor | None,
        r2l_index: torch.Tensor | None,
        step_offsets: torch.Tensor,
        labels: torch.Tensor | None,
    ) -> BiPRMOutput:
        """The heads on the hidden states [R, L, H] at each stream's step tags (indices flat over R x L)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        tags = flat[torch.cat([i for i in (l2r_index, r2l_index) if i is not None])]
        return self._heads_on(tags, l2r_index, r2l_index, step_offsets, labels)

    def _heads_on(
        self,
        tags: torch.Tensor,
        l2r_index: torch.Tensor | None,
        r2l_index: torch.Tensor | None,
        step_offsets: torch.Tensor,
        labels: torch.Tensor | None,
    ) -> BiPRMOutput:
        """Every entry point ends here: `tags` holds the L2R tags, then the R2L ones, each in forward step order."""
        n = 0 if l2r_index is None else len(l2r_index)
        h_l2r = tags[:n] if l2r_index is not None else None
        h_r2l = tags[n:] if r2l_index is not None else None
        return self.heads(h_l2r, h_r2l, step_offsets, labels)

    def heads(
        self,
        h_l2r: torch.Tensor | None,
        h_r2l: torch.Tensor | None,
        step_offsets: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> BiPRMOutput:
        """Value head, gate, fusion and loss on the step-tag hidden states of each stream (forward step order).

        All of it runs in fp32 on upcast hidden states, outside autocast, whatever the dtype of the body
        or of the heads' weights (`Float32Linear`).
        """
        h_l2r, h_r2l = (None if h is None else h.float() for h in (h_l2r, h_r2l))
        with torch.autocast(h_l2r.device.type if h_l2r is not None else h_r2l.device.type, enabled=False):
            return self._heads(h_l2r, h_r2l, step_offsets, labels)

    def _heads(
        self,
        h_l2r: torch.Tensor | None,
        h_r2l: torch.Tensor | None,
        step_offsets: torch.Tensor,
        labels: torch.Tensor | None,
    ) -> BiPRMOutput:
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

    def _for_backend(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """Boolean masks for SDPA; eager attention adds the mask to the scores instead."""
        if mask is None or self.backbone.config._attn_implementation != "eager":
            return mask
        return torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(self.dtype).min
        )

    def _cached_tags(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        unit_ids: torch.Tensor,
        prefix_ids: torch.Tensor,
        prefix_lengths: torch.Tensor,
        prefix_rows: torch.Tensor,
        chunks: torch.Tensor,
        flat_index: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states at `flat_index` (flat over [R, L]) for the prefix-cache layout.

        One call encodes the prompts (right padding is invisible to real tokens under the
        plain causal mask); then each chunk of length-sorted rows, trimmed to its widest
        row, attends to its prompts' cached keys and values, so padding and attention
        stay proportional to each row's own length.
        """
        name = cache_argument(self.backbone)
        cache = getattr(self.backbone(input_ids=prefix_ids, use_cache=True), name)
        layers = [(k, v) for k, v, *_ in cache]
        starts = chunks[
            :-1
        ].tolist()  # `chunks` and the widths are read once, not once per chunk: each read waits on a GPU
        widths = (unit_ids >= 0).sum(1)[starts].tolist()
        L = input_ids.shape[1]
        row, col = flat_index // L, flat_index % L
        tags = torch.empty(
            len(flat_index), self.config.backbone_config.hidden_size, dtype=self.dtype, device=input_ids.device
        )
        for a, b, w in zip(starts, chunks[1:].tolist(), widths):
            rows = prefix_rows[a:b]
            mask = cached_attention_mask(unit_ids[a:b, :w], prefix_lengths[rows], prefix_ids.shape[1])
            hidden = self.backbone(
                input_ids=input_ids[a:b, :w],
                attention_mask=self._for_backend(mask),
                position_ids=position_ids[a:b, :w],
                **{name: DynamicCache([(k[rows], v[rows]) for k, v in layers])},
                use_cache=True,
            ).last_hidden_state
            here = (row >= a) & (row < b)
            tags[here] = hidden[row[here] - a, col[here]]
        return tags

    def _sigma(self, h_l2r: torch.Tensor | None, h_r2l: torch.Tensor | None) -> torch.Tensor | None:
        """Gate weight on the L2R stream: learned for `bi`, 0.5 for `bi-static`, none for one stream."""
        if MODE_TABLE[self.config.mode].fusion == "static":
            return torch.full(h_l2r.shape[:1], 0.5, dtype=h_l2r.dtype, device=h_l2r.device)
        if self.gate is None:
            return None
        gate_in = torch.cat([h_l2r, h_r2l], dim=-1)
        if self.config.detach_gate_inputs:
            gate_in = gate_in.detach()
        return torch.sigmoid(self.gate(gate_in).squeeze(-1))


SUPPORTED = ("llama", "mistral", "qwen2")  # bodies whose forward is "embed, layers, norm" with a per-layer mask


def _view(body: nn.Module, layers: range, norm: nn.Module) -> nn.Module:
    """A shallow copy of `body` that runs only `layers`, then `norm`; parameters stay shared."""
    view = copy.copy(body)
    view._modules = {**body._modules, "layers": nn.ModuleList(body.layers[i] for i in layers), "norm": norm}
    config = copy.copy(body.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [body.config.layer_types[i] for i in layers]
    view.config = config
    return view


def split(model: BiPRMModel, top_layers: int) -> tuple[nn.Module, nn.Module]:
    """(bottom, top) views of the model's body: embeddings + first N-K layers, last K layers + norm."""
    body = model.backbone
    kind = body.config.model_type
    if kind not in SUPPORTED:
        raise ValueError(
            f"--train-top-layers supports Llama-family bodies {SUPPORTED}; this backbone is {kind!r}. "
            "Train it in full instead (leave --train-top-layers unset)."
        )
    n = body.config.num_hidden_layers
    if not 0 < top_layers <= n:
        raise ValueError(f"--train-top-layers must be in [1, {n}] for this {n}-layer backbone, got {top_layers}")
    cut = n - top_layers
    return _view(body, range(cut), nn.Identity()), _view(body, range(cut, n), body.norm)


def from_backbone(
    path: str,
    tokenizer,
    mode: str = "bi",
    objective: str = "bce",
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    **config_kwargs,
) -> BiPRMModel:
    """A fresh BiPRM on a pretrained body; adds the step tag to `tokenizer` and gives it a row (`init_new_rows`).

    The config takes the tokenizer's pad, bos and eos ids (`special_ids`)."""
    check_attention(attn_implementation)
    backbone = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    known = len(tokenizer)
    step_tag_id = add_step_tag(tokenizer)
    if len(tokenizer) > backbone.get_input_embeddings().num_embeddings:
        backbone.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    init_new_rows(backbone.get_input_embeddings().weight, known, len(tokenizer))
    config = BiPRMConfig(
        backbone_config=backbone.config,
        mode=mode,
        objective=objective,
        step_tag_id=step_tag_id,
        **special_ids(tokenizer),
        **config_kwargs,
    )
    model = BiPRMModel(
        config, backbone=backbone
    )  # the body in `dtype`, the heads in fp32 (as a bf16 checkpoint loads them)
    engine_dtype = next((p.dtype for p in backbone.parameters() if getattr(p, "ds_id", None) is not None), None)
    if (
        engine_dtype is not None
    ):  # built under ZeRO-3, in the engine's dtype: its optimizer takes one dtype for every weight
        for head in (model.value_head, model.gate):  # they still compute in fp32 (`Float32Linear`) and save in fp32
            if head is not None:
                head.to(engine_dtype)
    model.set_attn_implementation(attn_implementation)  # wrapping resets the body's setting
    return model


def from_prm(
    folder: ModelFolder | str,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    tokenizer: PreTrainedTokenizerBase | None = None,
    **config_kwargs,
) -> BiPRMModel:
    """A BiPRM built from another PRM's folder (biprm.prms), in any mode, without its remote code: its body as
    transformers builds it from the folder's config, its read-out as the value head shared by both streams, and its
    template and tag. The L2R stream is then the source PRM exactly. For the two-stream modes the gate is new; pass
    `gate_init` (the CLI's --init-from does, 8 by default) so that sigma starts near 1 and the fused score is the
    source's. `config_kwargs` may name another `mode` than the folder's reading (a gate mode, to be trained)."""
    folder = folder if isinstance(folder, ModelFolder) else resolve(folder)
    check_attention(attn_implementation)
    tokenizer = tokenizer or folder.tokenizer
    config = prm_config(folder, tokenizer, **config_kwargs)
    path, kind, spec = folder.path, folder.kind, folder.spec
    body_class = AutoModel._model_mapping[type(config.backbone_config)]
    with _quiet("transformers.modeling_utils"):  # the head's tensors are "not used" by the body: we read them ourselves
        backbone = body_class.from_pretrained(
            path, config=config.backbone_config, dtype=dtype, attn_implementation=attn_implementation
        )
    config.backbone_config = backbone.config
    model = BiPRMModel(config, backbone=backbone)
    missing, _ = model.load_state_dict(read_out(path, spec, tokenizer), strict=False)
    unset = [k for k in missing if k.startswith("value_head.")]
    if unset:
        raise UnknownPRM(f"{path}: the {kind} read-out left {unset} unset")
    model.set_attn_implementation(attn_implementation)
    logging.getLogger(__name__).info(
        "%s: read as %s, %s; its authors rank solutions by the %s of its step scores",
        path,
        kind,
        spec.source,
        spec.aggregation,
    )
    return model


def prm_config(folder: ModelFolder, tokenizer: PreTrainedTokenizerBase, **config_kwargs) -> BiPRMConfig:
    """The BiPRM config of another PRM's folder, read from its config.json (never its remote code): the body's config
    as transformers builds it for the folder's model_type, and the kind's head, template and step-tag id."""
    path, kind = folder.path, folder.kind
    if not folder.trained_elsewhere:
        raise UnknownPRM(f"{path}: a biprm checkpoint; load it with BiPRMModel.from_pretrained")
    if folder.implicit:
        raise UnknownPRM(
            f"{path}: an implicit PRM ({kind}) has no value head to build a BiPRM on; score it against its "
            "reference LM (--prm-reference, Scorer.from_pretrained(..., prm_reference=...))"
        )
    body_config = folder.body_config()
    tag = TEMPLATES[kind].tag
    step_tag_id = tokenizer.encode(tag.strip() or tag, add_special_tokens=False)[
        -1
    ]  # as the cards find it: encode("ки")[-1]
    return BiPRMConfig(
        backbone_config=body_config,
        step_tag_id=step_tag_id,
        prm_kind=kind,
        value_head=folder.spec.head,
        **special_ids(tokenizer),
        **({"mode": folder.mode} | config_kwargs),
    )


def special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The tokenizer's pad, bos and eos ids, for a model config: transformers' Trainer reads them from the top-level
    config and, finding none there, would set them itself and print a notice on every first run."""
    return {
        name: getattr(tokenizer, name)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id")
        if getattr(tokenizer, name) is not None
    }


def encoder_for(
    config: BiPRMConfig, tokenizer: PreTrainedTokenizerBase, max_length: int, overlength: str = "head"
) -> Encoder:
    """The encoder of a model's own template and tag (biprm's, or the PRM kind's it was made from)."""
    return Encoder(tokenizer, config.step_tag_id, max_length, TEMPLATES[config.prm_kind], overlength)


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def cache_argument(body: nn.Module) -> str:
    """What the body calls its KV cache, as an argument and as an output: `cache` since transformers 5.2x
    (the old name warns, and goes in 5.40), `past_key_values` before (vLLM pins transformers < 5.20)."""
    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"


def check_attention(kernel: str | None) -> None:
    if kernel not in (None, *ATTENTION):
        raise ValueError(
            f"attn_implementation {kernel!r}: BiPRM packs both streams of a trajectory into one row under "
            f"a mask of its own, which only {' and '.join(ATTENTION)} take"
        )


def init_new_rows(table: nn.Parameter, known: int, total: int) -> None:
    """Rows [known, total) of the embedding table (the tokens biprm added) start at the mean of the known
    tokens' rows, the same for every seed.

    Whether the table had to grow or not: Qwen2.5's is padded past its tokenizer (151,936 rows for
    151,665 tokens), so an added token lands on a row that was never trained, and with a frozen trunk
    it would stay so.
    """
    if total <= known:
        return
    with whole(table) as weight, torch.no_grad():
        weight[known:total] = weight[: min(known, len(weight))].mean(0)


@contextmanager
def whole(param: nn.Parameter) -> Iterator[torch.Tensor]:
    """The full tensor of a parameter that DeepSpeed ZeRO-3 may have partitioned, for writing: gathered
    on entry, and rank 0's values partitioned back on exit. An empty parameter that cannot be gathered is
    refused, since writing into it would change nothing."""
    if getattr(param, "ds_id", None) is not None:
        import deepspeed

        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            yield param
    elif param.numel() == 0:
        raise RuntimeError(
            f"a parameter of shape {tuple(param.shape)} is partitioned by an engine biprm cannot gather "
            "(only DeepSpeed ZeRO-3 is known); load the backbone whole to initialise the step tag's row"
        )
    else:
        yield param


AutoConfig.register("biprm", BiPRMConfig)
AutoModel.register(BiPRMConfig, BiPRMModel)
