"""The vLLM model: a backbone from vLLM's own model zoo, then biprm's heads at the step tags.

The value head is the export's: Linear(H, 1), or Linear(H, H) -> ReLU -> Linear(H, 1) (Qwen's PRM
head), which also reads any PRM's read-out, written as one logit by the export (vLLM's own STEP
pooling reads a causal-LM PRM's hidden dimensions where it means its "+"/"-" logits, vLLM #16545).
The pooler returns a row at every token whose id is the step tag; where a kind's tag is ordinary
text ("\n") some of those lie inside the question or a step, and the IO processor, which knows
where each step piece ends, keeps the rows at those ends.

vLLM runs each stream as its own prompt, so one forward pass never sees both streams of a
trajectory. The gate's first layer splits by stream, W1·[h_L; h_R] = W1_L·h_L + W1_R·h_R,
so each stream's share is computed where that stream is pooled; the IO processor adds the
two shares, finishes the gate and fuses. Per step tag the pooler returns one row:
[value logit, W1_L·h + b1, W1_R·h] for `bi` (the IO processor keeps the half that belongs to
the stream), [value logit] for the other modes. The heads run in fp32, as in biprm.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Set

import torch
import torch.nn as nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.pooler import Pooler, PoolingParamsUpdate
from vllm.model_executor.layers.pooler.tokwise.methods import AllPool
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix
from vllm.sequence import IntermediateTensors
from vllm.v1.pool.metadata import PoolingMetadata

from biprm.config import MODE_TABLE
from biprm.vllm_plugin.fusion import stream_rows

BODIES = {
    "llama": "llama:LlamaModel",
    "qwen2": "qwen2:Qwen2Model",
    "qwen3": "qwen3:Qwen3Model",
    "mistral": "llama:LlamaModel",
}


def body_class(model_type: str) -> type[nn.Module]:
    if model_type not in BODIES:
        raise ValueError(f"biprm's vLLM plugin has no body for backbone type {model_type!r}; it knows {sorted(BODIES)}")
    module, name = BODIES[model_type].split(":")
    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


class StepHeads(Pooler):
    """Hidden states at the tokens of each request whose id is the step tag -> the head rows described above."""

    def __init__(self, model: "BiPRMForStepScoring", step_tag_id: int):
        super().__init__()
        self.tokens = AllPool()  # each request's hidden states, across chunked prefill
        self.model, self.step_tag_id = (
            [model],
            step_tag_id,
        )  # a list, so the model is not registered twice as a submodule

    def get_supported_tasks(self) -> Set[str]:
        return {"plugin"}

    def get_pooling_updates(self, task: str) -> PoolingParamsUpdate:
        return PoolingParamsUpdate(requires_token_ids=True)

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> list[torch.Tensor | None]:
        per_request = self.tokens(hidden_states, pooling_metadata)
        done = [i for i, h in enumerate(per_request) if h is not None]
        if not done:
            return per_request
        ids = pooling_metadata.get_prompt_token_ids_cpu()
        # the hidden states cover the prompt's last len(h) tokens
        # (all of them: prefix-cache reads are off for plugin tasks)
        where = [
            (ids[i][len(ids[i]) - len(per_request[i]) :] == self.step_tag_id).nonzero(as_tuple=True)[0] for i in done
        ]
        tags = torch.cat([per_request[i][w.to(per_request[i].device)] for i, w in zip(done, where)])
        rows = self.model[0].heads(tags).split([len(w) for w in where])
        out: list[torch.Tensor | None] = list(per_request)
        for i, r in zip(done, rows):
            out[i] = r
        return out


class BiPRMForStepScoring(nn.Module):
    is_pooling_model = True
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={"backbone.": "model."})

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.mode = config.biprm["mode"]
        self.model = body_class(config.model_type)(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        H, fp32 = config.hidden_size, torch.float32
        self.value_head = (
            nn.Linear(H, 1, dtype=fp32)
            if config.biprm.get("value_head", "linear") == "linear"
            else nn.Sequential(nn.Linear(H, H, dtype=fp32), nn.ReLU(), nn.Linear(H, 1, dtype=fp32))
        )
        gated = MODE_TABLE[self.mode].fusion == "gate"
        self.gate = (
            nn.Sequential(nn.Linear(2 * H, H, dtype=fp32), nn.ReLU(), nn.Linear(H, 1, dtype=fp32)) if gated else None
        )
        self.pooler = StepHeads(self, config.biprm["step_tag_id"])
        self.skip_prefixes = config.biprm.get(
            "skip_prefixes", []
        )  # a source PRM's own head, which the value head replaces
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def heads(self, h: torch.Tensor) -> torch.Tensor:
        return stream_rows(h, self.value_head, self.gate)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self, ignore_unexpected_prefixes=self.skip_prefixes).load_weights(
            weights, mapper=self.hf_to_vllm_mapper
        )
