"""Flags of `biprm serve` and `biprm export`: plain dataclasses, so the CLI lists them without the server stack."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from biprm.scoring.aggregate import AGGREGATIONS
from biprm.config import ScorerSettings, ZeroShotMode, arg, check_choices
from biprm.vllm_plugin import SERVED_DTYPES

Aggregation = Literal[AGGREGATIONS]
ServedDtype = Literal[SERVED_DTYPES]
API_KEY_ENV = "BIPRM_API_KEY"  # where the server (and biprm's client) read the API key when no flag names it


@dataclass
class ServeConfig(ScorerSettings):
    model: str = arg(
        help="checkpoint folder written by `biprm train` (or its `biprm export --format vllm`)", group="model"
    )
    engine: Literal["biprm", "vllm"] = arg(
        "biprm",
        "what scores: biprm's own Scorer, or a vLLM engine running biprm's plugin (extra [vllm])",
        group="compute",
    )
    engine_args: str = arg(
        "{}", "--engine vllm: JSON of vLLM engine arguments, e.g. '{\"tensor_parallel_size\": 2}'", group="compute"
    )
    host: str = arg(
        "127.0.0.1", "address to listen on (0.0.0.0 for every interface: set an API key first)", group="server"
    )
    api_key: str | None = arg(
        None,
        f"a key that every endpoint but /health wants as 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; "
        "prefer the variable: a flag shows in the process list)",
        group="server",
    )
    port: int = arg(8000, "TCP port", min=1, max=65535, group="server")
    max_wait_ms: float = arg(
        5.0, "how long the first request of a batch waits for others to join", min=0, group="server"
    )
    max_batch_tokens: int = arg(
        16384, "stop gathering a batch at this many tokens (both streams)", min=1, group="server"
    )
    max_queue: int = arg(1024, "solutions waiting at most; past it requests get 503 at once", min=1, group="server")
    on_overlength: Literal["flag", "refuse"] = arg(
        "flag", "flag: score the steps that fit and say so; refuse: answer 413", group="server"
    )
    aggregation: Aggregation = arg("min", "solution score of /get_reward", group="server")
    max_body_bytes: int = arg(
        8 * 2**20, "larger request bodies get 413 before they are read in full", min=1, group="server"
    )
    max_text_chars: int = arg(
        65536,
        "characters per solution (question and steps); longer ones get 413 before they are tokenized",
        min=1,
        group="server",
    )
    chat_template: str | None = arg(
        None,
        "the policy's tokenizer (folder or name): /get_reward takes the user's question out of prompts rendered with "
        "its chat template",
        group="server",
    )
    threshold: float = arg(
        0.5,
        "/get_reward's extra_logs name the first step whose probability is below this",
        min=0,
        max=1,
        group="server",
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the choices, and the segmenter's name
        if self.api_key == "":
            raise ValueError("--api-key is empty: give a key, or leave the flag out to serve without one")
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None


@dataclass
class ExportConfig:
    model: str = arg(
        help="checkpoint folder written by `biprm train`, or a PRM trained elsewhere (docs/PRMS.md)", group="model"
    )
    out: str = arg(help="folder to write the export into", group="output")
    overwrite: bool = arg(
        False,
        "replace the model files a folder already holds in --out (files of any other kind refuse it)",
        group="output",
    )
    overwrite: bool = arg(
        False,
        "replace the model files a folder already holds in --out (files of any other kind refuse it)",
        group="output",
    )
    prm_kind: str | None = arg(
        None,
        "for a PRM trained elsewhere: its kind (qwen-prm, skywork-prm, math-shepherd, rlhflow, "
        "token-classification; default: detected from its config.json)",
        group="model",
    )
    prm_mode: ZeroShotMode | None = arg(
        None,
        "for a PRM trained elsewhere: l2r (as shipped, the default), or zero-shot r2l or bi-static; "
        "a biprm checkpoint keeps the mode it was trained in",
        aliases=("--mode",),
        group="model",
    )
    format: Literal["vllm"] = arg(
        "vllm", "vllm: the backbone's flat config naming biprm's vLLM architecture, for `vllm serve`", group="data"
    )
    dtype: ServedDtype = arg(
        "bfloat16",
        "the dtype the export asks vLLM to run the backbone in (the heads stay fp32); vLLM would turn "
        "a float32 config into float16, so fp32 (CPU, or scores equal to biprm's) is asked for when "
        "serving it, on vLLM's command line, as the closing line of this command shows",
        group="compute",
    )

    def __post_init__(self) -> None:
        check_choices(self)
