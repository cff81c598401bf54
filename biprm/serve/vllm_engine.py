"""`biprm serve --engine vllm`: the Scorer's interface over a vLLM engine that runs the plugin.

The server keeps its endpoints, validation and batching; each batch becomes one
`LLM.encode` call through the IO processor, so vLLM schedules the stream prompts of every
solution in the batch together (continuous batching, its kernels, tensor parallelism).

The engine is checked before it starts (vLLM's CPU build starts with attention kernels that
cannot run the checkpoint and dies on the first request) and watched while it runs: when its
process ends, `failure` says why and a call waiting on it is woken with vLLM's EngineDeadError.

An implicit PRM (biprm.implicit: EurusPRM) has no read-out for a pooling model to run, so it needs no export: two
generating engines, one on the PRM and one on its reference LM, give the log-probability of each token of each stream
row (`prompt_logprobs`), and `read_steps` reads q from their difference as biprm's own scorer does.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from multiprocessing.connection import wait

import numpy as np
import torch

from biprm.config import MODE_TABLE
from biprm.data.encoding import Encoded, Encoder
from biprm.data.template import TEMPLATES
from biprm.implicit import Reading, read_steps, reading, stream_row
from biprm.folder import ModelFolder, body_config, resolve
from biprm.scoring.step_scores import StepScores, offsets_of
from biprm.scoring.scorer import Collector, Scorer
from biprm.vllm_plugin.spec import spec_encoder
from biprm.serve.export import export_for_vllm


def vllm_folder(folder: ModelFolder) -> str:
    """The folder if it is already an export, else an export beside it in a scratch folder (weights linked, not
    copied), in the folder's reading."""
    if folder.kind == "export":
        return folder.path
    scratch = tempfile.mkdtemp(prefix="biprm-vllm-")
    return str(export_for_vllm(folder, scratch, link=True))


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
    except (
        TypeError,
        ValueError,
    ) as error:  # an unknown engine argument, a dtype the device lacks, no attention backend
        raise ValueError(
            f"{path}: vLLM cannot run it with the engine arguments {engine_args}: {one_line(error)}"
        ) from None
    problems = []
    if not backend.supports_head_size(head):
        problems.append(f"head size {head} (it takes {', '.join(map(str, backend.get_supported_head_sizes()))})")
    if not backend.supports_dtype(dtype):
        problems.append(f"dtype {dtype} (it takes {', '.join(map(str, backend.supported_dtypes))})")
    if problems:
        raise ValueError(
            f"{path}: vLLM's {backend.get_name()} attention cannot run this checkpoint: {'; '.join(problems)}; "
            "serve it with --engine biprm"
        )


def start_engine(path: str, engine_args: dict):
    """vLLM's LLM over `engine_args` (in bfloat16 on a GPU, float32 on a CPU, unless they say), checked first
    (`check_engine`); an engine that does not start is a ValueError in one line."""
    from vllm import LLM

    engine_args = {"dtype": "bfloat16" if torch.cuda.is_available() else "float32", **engine_args}
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # CPU builds pin threads to cores otherwise
    check_engine(path, engine_args)
    try:
        return LLM(**engine_args)
    except RuntimeError as error:  # "Engine core initialization failed. See root cause above."
        raise ValueError(f"{path}: the vLLM engine did not start: {one_line(error)}") from error


def engine_resources(llm):
    """vLLM's record of an engine's processes and of a fatal error it saw (None when the engine runs in this
    process)."""
    return getattr(llm.llm_engine.engine_core, "resources", None)


def engine_processes(llm) -> list:
    """An engine's own processes."""
    resources = engine_resources(llm)
    return list(getattr(resources and resources.engine_manager, "processes", None) or [])


class VLLMScorer:
    """`Scorer`'s interface (`encode`, then `score`) with a vLLM engine doing the model's work."""

    encode = Scorer.encode  # one encoding path for both engines: it needs only `encoder` and `max_length`

    def __init__(self, llm, folder: ModelFolder):
        self.llm = llm
        spec = folder.trained
        self.mode = spec["mode"]
        self.tokenizer = folder.tokenizer
        self.encoder = spec_encoder(spec, self.tokenizer, llm.llm_engine.model_config.max_model_len)
        self.watch()

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        max_length: int,
        prm_kind: str | None = None,
        prm_reference: str | None = None,
        prm_mode: str | None = None,
        **engine_args,
    ) -> "VLLMScorer":
        """The engine over `path` (a biprm checkpoint, its export, or a PRM trained elsewhere: biprm.prms); a checkpoint
        it cannot run is a ValueError in one line, before the engine starts. A PRM trained elsewhere is read in
        `prm_mode` (biprm.prms.reading_mode), an implicit one against the reference LM in `prm_reference`
        (`ImplicitVLLMScorer`)."""
        folder = resolve(path, prm_kind, prm_mode, prm_reference)
        if folder.implicit:
            return ImplicitVLLMScorer.start(folder, max_length, engine_args)
        export = resolve(vllm_folder(folder))
        return cls(start_engine(path, {"model": export.path, "max_model_len": max_length, **engine_args}), export)

    @property
    def engines(self) -> list:
        """The vLLM engines (LLM) that score."""
        return [self.llm]

    def watch(self) -> None:
        """Watch each engine that runs in processes of its own (`_watch`)."""
        self.closing = False
        for llm in self.engines:
            if engine_processes(llm):
                threading.Thread(target=self._watch, args=(llm,), name="biprm-vllm-watch", daemon=True).start()

    def processes(self) -> list:
        """The engines' own processes."""
        return [p for llm in self.engines for p in engine_processes(llm)]

    def failure(self) -> str | None:
        """Why the engine can no longer score, in one line; None while it can."""
        ended = [p for p in self.processes() if p.exitcode is not None]
        if ended:
            p = ended[0]
            how = (
                f"was killed by {signal.Signals(-p.exitcode).name}"
                if p.exitcode < 0
                else f"exited with code {p.exitcode}"
            )
            return f"the vLLM engine process {p.name} (pid {p.pid}) {how}; vLLM's log says more"
        if any(getattr(engine_resources(llm), "engine_dead", False) for llm in self.engines):
            return "the vLLM engine reported a fatal error; vLLM's log has its traceback"
        return None

    def _watch(self, llm) -> None:
        """Wait for a process of `llm` to end; unless we stopped it, wake the call blocked on its output (vLLM leaves
        that call waiting forever when the process is killed)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        wait([p.sentinel for p in engine_processes(llm)])
        if not self.closing:
            llm.llm_engine.engine_core.outputs_queue.put_nowait(EngineDeadError())

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    def close(self) -> None:
        """Stop the engines' processes now rather than at exit."""
        self.closing = True
        for llm in self.engines:
            llm.llm_engine.engine_core.shutdown()

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
            sigma=None
            if answers[0]["sigma"] is None
            else np.concatenate([a["sigma"] for a in answers]).astype(np.float64),
        )


class ImplicitVLLMScorer(VLLMScorer):
    """An implicit PRM (biprm.implicit) over two generating vLLM engines, the PRM's (`llm`) and its reference LM's:
    each stream row (`stream_row`) is a prompt of each, generating one token, whose prompt log-probs give log p of
    each of the row's tokens; beta times their difference is what `read_steps` reads q from, as `ImplicitPRM` does."""

    def __init__(self, llm, reference, tokenizer, read: Reading, mode: str):
        self.llm, self.reference, self.tokenizer, self.read, self.mode = llm, reference, tokenizer, read, mode
        self.encoder = Encoder(
            tokenizer, read.tag_id, llm.llm_engine.model_config.max_model_len - 1, TEMPLATES[read.kind]
        )
        self.watch()

    @classmethod
    def start(cls, folder: ModelFolder, max_length: int, engine_args: dict) -> "ImplicitVLLMScorer":
        """Both engines, for stream rows of up to `max_length` tokens; a missing or mismatched reference and a mode
        with a gate are refused in one line before either starts (`implicit.reading`)."""
        tokenizer = folder.tokenizer
        read = reading(folder, tokenizer)
        engines = []
        try:
            for path in (folder.path, folder.reference):
                engines.append(
                    start_engine(path, {"model": path, "runner": "generate", **room(path, max_length), **engine_args})
                )
        except BaseException:
            for llm in engines:
                llm.llm_engine.engine_core.shutdown()
            raise
        return cls(*engines, tokenizer, read, folder.mode)

    @property
    def engines(self) -> list:
        return [self.llm, self.reference]

    def score(self, encs: list[Encoded], progress: bool = False) -> StepScores:
        """Scores of `encode`'s encodings in their order, as `Scorer.score` gives them (logits)."""
        built = [stream_row(e, s, self.read) for s in MODE_TABLE[self.mode].streams for e in encs]
        ratio = torch.zeros(len(built), max(len(row) for row, _ in built) - 1, dtype=torch.float64)
        for sign, llm in ((1, self.llm), (-1, self.reference)):
            for r, logps in enumerate(prompt_logps(llm, [row for row, _ in built], progress)):
                ratio[r, : len(logps)] += sign * torch.tensor(logps, dtype=torch.float64)
        collect = Collector(offsets_of([len(e.steps) for e in encs]), self.mode)
        collect(
            np.arange(len(encs)), read_steps(self.read.beta * ratio, built, [len(e.prompt) for e in encs], self.mode)
        )
        return collect.scores()


def room(folder: str, max_length: int) -> dict:
    """Engine arguments for prompts of up to `max_length` tokens: vLLM's generate runner wants room for the one token
    it generates after the prompt, which it never runs through the model, so that token may stand one past a window
    the rows fill (model_max_length is how far vLLM lets max_model_len go). On a GPU the two engines share it."""
    window = getattr(body_config(folder), "max_position_embeddings", None)
    return {
        "max_model_len": max_length + 1,
        **({"hf_overrides": {"model_max_length": window + 1}} if window == max_length else {}),
        **({"gpu_memory_utilization": 0.45} if torch.cuda.is_available() else {}),
    }  # half of vLLM's default 0.9 each


def prompt_logps(llm, rows: list[list[int]], progress: bool) -> list[list[float]]:
    """log p(row[j] | row[:j]) for j >= 1 of each row, from one call of the engine's generate runner."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=row) for row in rows], params, use_tqdm=progress)
    return [
        [at[token].logprob for at, token in zip(out.prompt_logprobs[1:], row[1:])] for out, row in zip(outputs, rows)
    ]
