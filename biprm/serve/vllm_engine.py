"""`biprm serve --engine vllm`: the Scorer's interface over a vLLM engine that runs the plugin.

The server keeps its endpoints, validation and batching; each batch becomes one
`LLM.encode` call through the IO processor, so vLLM schedules the stream prompts of every
solution in the batch together (continuous batching, its kernels, tensor parallelism).

The engine is checked before it starts (vLLM's CPU build starts with attention kernels that
cannot run the checkpoint and dies on the first request) and watched while it runs: when its
process ends, `failure` says why and a call waiting on it is woken with vLLM's EngineDeadError.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import torch

from biprm.backbones import load_tokenizer
from biprm.data.encoding import Encoded
from biprm.scoring.step_scores import StepScores, offsets_of
from biprm.scoring.scorer import Scorer
from biprm.vllm_plugin import ARCHITECTURE
from biprm.vllm_plugin.spec import spec_encoder
from biprm.serve.export import export_for_vllm


def vllm_folder(path: str, prm_kind: str | None = None) -> str:
    """`path` if it is already an export, else an export beside it in a scratch folder (weights linked, not copied);
    a PRM trained elsewhere (of the kind detected, or `prm_kind`) is read as shipped."""
    config = json.loads((Path(path) / "config.json").read_text())
    if config.get("architectures") == [ARCHITECTURE]:
        return path
    return str(export_for_vllm(path, tempfile.mkdtemp(prefix="biprm-vllm-"), link=True, prm_kind=prm_kind))


def one_line(error: BaseException) -> str:
    """vLLM's message (pydantic's run over many lines) as one line, for the command line's error."""
    return " ".join(str(error).split())


def check_engine(path: str, engine_args: dict) -> None:
    """Refuse settings vLLM rejects and a checkpoint whose head size or dtype the platform's attention cannot run,
    in one line and before any engine process starts."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.selector import get_attn_backend

    load_general_plugins()  # the architecture must be known in this process too
    try:
        config = EngineArgs(**engine_args).create_engine_config()
        model = config.model_config
        head, dtype = model.get_head_size(), model.dtype
        with set_current_vllm_config(config):
            backend = get_attn_backend(head, dtype, config.cache_config.cache_dtype)
    except (TypeError, ValueError) as error:  # an unknown engine argument, a dtype the device lacks, no attention backend
        raise ValueError(f"{path}: vLLM cannot run it with the engine arguments {engine_args}: {one_line(error)}") from None
    problems = []
    if not backend.supports_head_size(head):
        problems.append(f"head size {head} (it takes {', '.join(map(str, backend.get_supported_head_sizes()))})")
    if not backend.supports_dtype(dtype):
        problems.append(f"dtype {dtype} (it takes {', '.join(map(str, backend.supported_dtypes))})")
    if problems:
        raise ValueError(f"{path}: vLLM's {backend.get_name()} attention cannot run this checkpoint: {'; '.join(problems)}; "
                         "serve it with --engine biprm")


class VLLMScorer:
    """`Scorer`'s interface (`encode`, then `score`) with a vLLM engine doing the model's work."""

    encode = Scorer.encode  # one encoding path for both engines: it needs only `encoder` and `max_length`

    def __init__(self, llm, folder: str):
        self.llm = llm
        spec = json.loads((Path(folder) / "config.json").read_text())["biprm"]
        self.mode = spec["mode"]
        self.tokenizer = load_tokenizer(folder)
        self.encoder = spec_encoder(spec, self.tokenizer, llm.llm_engine.model_config.max_model_len)
        self.closing = False
        if self.processes():
            threading.Thread(target=self._watch, name="biprm-vllm-watch", daemon=True).start()

    @classmethod
    def from_pretrained(cls, path: str, max_length: int, prm_kind: str | None = None, **engine_args) -> "VLLMScorer":
        """The engine over `path` (a biprm checkpoint, its export, or a PRM trained elsewhere: biprm.prms); a checkpoint
        it cannot run is a ValueError in one line, before the engine starts."""
        from vllm import LLM

        folder = vllm_folder(path, prm_kind)
        engine_args = {"dtype": "bfloat16" if torch.cuda.is_available() else "float32", "model": folder, "max_model_len": max_length, **engine_args}
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # CPU builds pin threads to cores otherwise
        check_engine(path, engine_args)
        try:
            return cls(LLM(**engine_args), folder)
        except RuntimeError as error:  # "Engine core initialization failed. See root cause above."
            raise ValueError(f"{path}: the vLLM engine did not start: {one_line(error)}") from error

    def _resources(self):
        """vLLM's record of the engine's processes and of a fatal error it saw (None when the engine runs in this process)."""
        return getattr(self.llm.llm_engine.engine_core, "resources", None)

    def processes(self) -> list:
        """The engine's own processes."""
        resources = self._resources()
        return list(getattr(resources and resources.engine_manager, "processes", None) or [])

    def failure(self) -> str | None:
        """Why the engine can no longer score, in one line; None while it can."""
        ended = [p for p in self.processes() if p.exitcode is not None]
        if ended:
            p = ended[0]
            how = f"was killed by {signal.Signals(-p.exitcode).name}" if p.exitcode < 0 else f"exited with code {p.exitcode}"
            return f"the vLLM engine process {p.name} (pid {p.pid}) {how}; vLLM's log says more"
        if getattr(self._resources(), "engine_dead", False):
            return "the vLLM engine reported a fatal error; vLLM's log has its traceback"
        return None

    def _watch(self) -> None:
        """Wait for an engine process to end; unless we stopped it, wake the call blocked on its output (vLLM leaves
        that call waiting forever when the process is killed)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        wait([p.sentinel for p in self.processes()])
        if not self.closing:
            self.llm.llm_engine.engine_core.outputs_queue.put_nowait(EngineDeadError())

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    def close(self) -> None:
        """Stop the engine's processes now rather than at exit."""
        self.closing = True
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
