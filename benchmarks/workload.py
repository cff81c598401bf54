"""What the benchmarks run: random weights in a real backbone's shape, real GSM8K candidates.

Weights are random (timing does not depend on them) but built from the backbone's own
config and tokenizer, so shapes and token counts are the real ones. Every model here
shares one causal LM: BiPRM uses its body, the reference pattern the whole LM with its
head, so all configurations fit in memory at once and run side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from biprm.backbones import load_tokenizer, resolve_backbone
from benchmarks.reference import ReferencePRM, reference_inputs
from biprm.config import MAX_LENGTH
from biprm.data.encoding import Encoded, Encoder, add_step_tag
from biprm.data.trajectory import Trajectory
from biprm.modeling import BiPRMConfig, BiPRMModel, BiPRMOutput
from biprm.packing import pack

MEASURED_MODES = ("l2r", "bi")  # one stream and two: r2l costs what l2r does, bi-static what bi does
CANDIDATES = 12  # per question in gsm8k_bon_small


@dataclass
class Bench:
    tokenizer: PreTrainedTokenizerBase
    lm: PreTrainedModel
    ours: dict[str, BiPRMModel]
    ref: dict[str, ReferencePRM]

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def encoder(self, max_length: int = MAX_LENGTH) -> Encoder:
        return Encoder(self.tokenizer, self.ours["bi"].config.step_tag_id, max_length)


def build(shape: str, seed: int = 0) -> Bench:
    path = resolve_backbone(shape)
    tokenizer = load_tokenizer(path)
    tag = add_step_tag(tokenizer)
    torch.manual_seed(seed)
    lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), attn_implementation="sdpa")
    lm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    ours = {}
    for mode in MEASURED_MODES:
        ours[mode] = BiPRMModel(BiPRMConfig(backbone_config=lm.config, mode=mode, step_tag_id=tag), backbone=lm.model)
        ours[mode].set_attn_implementation("sdpa")
    ref = {mode: ReferencePRM(lm, model.value_head, model.gate) for mode, model in ours.items()}
    return Bench(tokenizer, lm, ours, ref)


def question_pool(pool: list[Trajectory], n_questions: int, seed: int = 0) -> list[Trajectory]:
    """All candidates of `n_questions` questions of gsm8k_bon_small drawn at random, grouped by question."""
    picked = np.sort(np.random.default_rng(seed).choice(len(pool) // CANDIDATES, n_questions, replace=False))
    return [pool[q * CANDIDATES + c] for q in picked for c in range(CANDIDATES)]


def training_batch(pool: list[Trajectory], encoder: Encoder, size: int, tokens: int, seed: int = 0) -> list[Encoded]:
    """`size` random trajectories whose stream is 3/4 to all of `tokens` long, labelled with their correctness."""
    batch = []
    for i in np.random.default_rng(seed).permutation(len(pool)):
        enc = encoder.encode(pool[i])
        if tokens * 3 // 4 <= enc.n_tokens <= tokens and enc.n_dropped == 0:
            batch.append(Encoded(enc.prompt, enc.steps, [float(bool(pool[i].correct))] * len(enc.steps)))
            if len(batch) == size:
                return batch
    raise ValueError(f"fewer than {size} trajectories are {tokens * 3 // 4}-{tokens} tokens long")


def training_config(bench: Bench, encs: list[Encoded], name: str) -> tuple[torch.nn.Module, dict]:
    """Model and inputs of one training configuration: `ref-<mode>`, or `<mode>:plain|tree|packed<N>`.

    plain: every stream its own row, prompt copied, plain causal attention, no mask.
    tree: one row per trajectory, its prompt once, then both streams (custom mask).
    packed<N>: tree units packed into rows of at most N tokens, no padding between them.
    """
    if name.startswith("ref-"):
        mode = name[4:]
        return bench.ref[mode], reference_inputs(encs, mode, bench.pad_id)
    mode, layout = name.split(":")
    if layout in ("plain", "tree"):
        share, rows = layout == "tree", None
    else:
        share, rows = True, int(layout.removeprefix("packed"))
    return bench.ours[mode], pack(encs, mode, share, rows, bench.pad_id)


def train_step(model: torch.nn.Module, inputs: dict, optimizer: torch.optim.Optimizer) -> None:
    out: BiPRMOutput = model(**inputs)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
