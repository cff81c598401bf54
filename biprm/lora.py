"""LoRA through `peft`: adapters on the backbone's linear layers; the heads and the step-tag row train in full.

The value head, the gate and the step-tag embedding row are new, so a low-rank update
of them would make no sense.

Training sees a `PeftModel`; the checkpoint it leaves is the merged `BiPRMModel`, so
`Scorer.from_pretrained` and `biprm serve` load it like any other, and the adapter alone
is kept beside it in `adapter/` for users who stack or swap adapters.
"""

from __future__ import annotations

from pathlib import Path

import torch

from biprm.config import LORA_TARGETS
from biprm.modeling import BiPRMModel, head_masters


def with_lora(model: BiPRMModel, r: int, alpha: float, dropout: float = 0.0, targets: tuple[str, ...] = LORA_TARGETS):
    try:
        from peft import LoraConfig, get_peft_model
    except ModuleNotFoundError:
        raise ModuleNotFoundError("--lora-r needs peft: pip install -e '.[peft]'") from None
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=rf"backbone\..*\.({'|'.join(targets)})",
        modules_to_save=["value_head", "gate"] if model.gate is not None else ["value_head"],
        trainable_token_indices={"embed_tokens": [model.config.step_tag_id]},
    )
    peft_model = get_peft_model(model, config)
    if not any("lora_" in n for n, _ in peft_model.named_parameters()):
        raise ValueError(f"--lora-targets {','.join(targets)} match no linear layer of this backbone")
    return peft_model


def lora_head_masters(peft_model) -> dict[str, torch.Tensor]:
    """The heads' fp32 master weights from a DeepSpeed optimizer, by the merged model's names. PEFT trains the heads as
    `modules_to_save` copies (`value_head.modules_to_save.default.weight`), and DeepSpeed's bf16 mode keeps bf16 copies
    of those in the module: a merged save from them rounds the heads. Every rank must call this (ZeRO gathers them)."""
    return {
        name.replace(".modules_to_save.default", ""): master
        for name, master in head_masters(peft_model.get_base_model()).items()
    }


def save_merged(peft_model, tokenizer, out: str | Path, heads: dict[str, torch.Tensor] | None = None) -> None:
    """The adapter in out/adapter, and the merged full model (what scoring loads) in out, its heads taken from `heads`
    (`lora_head_masters`) where given."""
    out = Path(out)
    peft_model.save_pretrained(out / "adapter")
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(out, state_dict={**merged.state_dict(), **(heads or {})})
    tokenizer.save_pretrained(out)
