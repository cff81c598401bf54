"""`biprm serve --engine vllm`: the Scorer's interface over a vLLM engine that runs the plugin.

The server keeps its endpoints, validation and batching; each batch becomes one
`LLM.encode` call through the IO processor, so vLLM schedules the stream prompts of every
solution in the batch together (continuous batching, its kernels, tensor parallelism).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from biprm.backbones import load_tokenizer
from biprm.data.encoding import Encoded, Encoder
from biprm.scores import StepScores, offsets_of
from biprm.scoring import Scorer
from biprm.vllm_plugin import ARCHITECTURE
from biprm.vllm_plugin.export import export_for_vllm


def vllm_folder(path: str) -> str:
    """`path` if it is already an export, else an export beside it in a scratch folder (weights linked, not copied)."""
    config = json.loads((Path(path) / "config.json").read_text())
    if config.get("architectures") == [ARCHITECTURE]:
        return path
    return str(export_for_vllm(path, tempfile.mkdtemp(prefix="biprm-vllm-"), link=True))


class VLLMScorer:
    """`Scorer`'s interface (`encode`, then `score`) with a vLLM engine doing the model's work."""

    encode = Scorer.encode  # one encoding path for both engines: it needs only `encoder` and `max_length`

    def __init__(self, llm, folder: str):
        self.llm = llm
        spec = json.loads((Path(folder) / "config.json").read_text())["biprm"]
        self.mode = spec["mode"]
        self.tokenizer = load_tokenizer(folder)
        self.encoder = Encoder(self.tokenizer, spec["step_tag_id"], llm.llm_engine.model_config.max_model_len)

    @classmethod
    def from_pretrained(cls, path: str, max_length: int, **engine_args) -> "VLLMScorer":
        from vllm import LLM

        folder = vllm_folder(path)
        engine_args = {"dtype": "bfloat16" if torch.cuda.is_available() else "float32", **engine_args}
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # CPU builds pin threads to cores otherwise
        return cls(LLM(model=folder, max_model_len=max_length, **engine_args), folder)

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    def close(self) -> None:
        """Stop the engine's processes now rather than at exit."""
        self.llm.llm_engine.engine_core.shutdown()

    def score(self, encs: list[Encoded], progress: bool = False) -> StepScores:
        """Scores of `encode`'s encodings in their order, as `Scorer.score` gives them (logits; trailing steps past
        max_length unscored)."""
        data = [{"prompt_ids": e.prompt, "step_ids": e.steps} for e in encs]
        answers = self.llm.encode({"data": data}, pooling_task="plugin", use_tqdm=progress)[0].outputs
        join = lambda key: np.concatenate([a["logits"][key] for a in answers]).astype(np.float64)  # noqa: E731
        has = answers[0]["logits"]
        return StepScores(
            offsets=offsets_of([a["steps_scored"] for a in answers]),
            fused=join("fused"),
            l2r=None if has["l2r"] is None else join("l2r"),
            r2l=None if has["r2l"] is None else join("r2l"),
            sigma=None if answers[0]["sigma"] is None else np.concatenate([a["sigma"] for a in answers]).astype(np.float64),
        )
