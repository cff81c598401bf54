"""`biprm serve`: answers equal Scorer.score, requests share batches, bad input is a 400 naming the field,
overload is a quick 503, over-long input is flagged or refused, shutdown finishes accepted requests."""

import asyncio
import json
import copy
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

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from biprm.data.readers import split_steps  # noqa: E402
from biprm.data.trajectory import Trajectory  # noqa: E402
from biprm.scoring.step_scores import StepScores  # noqa: E402
from biprm.serve.app import build_app  # noqa: E402
from biprm.serve.batcher import Batcher, Overloaded  # noqa: E402
from biprm.serve.config import ServeConfig  # noqa: E402
from conftest import scored  # noqa: E402

Q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
STEPS = ["Tom starts with 3 apples.", "He buys 4 more, so 3 + 4 = 7.", "The answer is 7."]


def client(bi_scorer, **kw) -> TestClient:
    """A server over `bi_scorer` (either engine); a copy of it reads another max_length or overlength policy when the
    settings ask for one."""
    cfg = ServeConfig(model="tiny", **kw)
    if (bi_scorer.max_length, bi_scorer.encoder.overlength) != (cfg.max_length, cfg.overlength):
        bi_scorer, encoder = copy.copy(bi_scorer), copy.copy(bi_scorer.encoder)
        bi_scorer.encoder, encoder.max_length, encoder.overlength = encoder, cfg.max_length, cfg.overlength
    return TestClient(build_app(bi_scorer, cfg))


def test_score_equals_the_scorer_for_steps_and_free_text(bi_scorer):
    text = "\n\n".join(STEPS)
    want = scored(bi_scorer, [Trajectory(Q, STEPS)])
    with client(bi_scorer) as c:
        one = c.post("/v1/score", json={"question": Q, "steps": STEPS}).json()
        many = c.post("/v1/score", json=[{"question": Q, "solution": text}, {"question": Q, "steps": STEPS[:1]}]).json()
    for stream in ("l2r", "r2l", "sigma", "fused"):
        assert one[stream] == want.of(0, stream).tolist()
    assert one["solution"]["min"] == float(want.solution_scores("min")[0]) and set(one["solution"]) == {
        "min",
        "mean",
        "prod",
        "max",
        "last",
    }
    assert one["steps_scored"] == 3 and one["truncated"] is False
    # scored beside another request: the same up to float32 rounding of a differently shaped batch
    assert many[0]["steps"] == STEPS and many[0]["fused"] == pytest.approx(one["fused"], abs=1e-6)
    assert many[1]["fused"] == pytest.approx(scored(bi_scorer, [Trajectory(Q, STEPS[:1])]).prob().tolist(), abs=1e-6)


def test_get_reward_speaks_the_openrlhf_interface(bi_scorer):
    prompt = f"<|user|>{Q}<|assistant|>"
    responses = ["3 + 4 = 7.\nThe answer is 7.", "3 + 4 = 8.\nThe answer is 8.</s>"]
    with client(bi_scorer, aggregation="mean", segmenter="newline") as c:
        body = c.post(
            "/get_reward", json={"query": [prompt + r for r in responses], "prompts": [prompt, prompt]}
        ).json()
    assert set(body) == {"rewards", "scores", "extra_logs", "step_rewards"} and len(body["rewards"]) == 2
    trajs = [
        Trajectory(prompt, split_steps(r.replace(bi_scorer.tokenizer.eos_token, ""), "newline")) for r in responses
    ]
    want = scored(bi_scorer, trajs)
    assert body["rewards"] == body["scores"] == want.solution_scores("mean").tolist()
    assert body["step_rewards"] == [want.of(0).tolist(), want.of(1).tolist()]


def test_a_solution_is_cut_by_the_segmenter_the_request_or_the_server_names(bi_scorer):
    """One splitter: the request's segmenter ('split' is its old name), else the server's; each step's span comes
    back."""
    text = "3 + 4 = 7.\nSo the answer is 7.\n\nWait, let me check: 7 - 4 = 3."
    with client(bi_scorer, segmenter="paragraph") as c:
        server = c.post("/v1/score", json={"question": Q, "solution": text}).json()
        lines, old = (
            c.post("/v1/score", json={"question": Q, "solution": text, key: "lines"}).json()
            for key in ("segmenter", "split")
        )
    assert server["segmenter"] == "paragraph" and server["offsets"] == [[0, 30], [32, 62]]
    assert lines == old and lines["segmenter"] == "lines" and lines["offsets"] == [[0, 10], [11, 30], [32, 62]]
    assert [text[a:b] for a, b in lines["offsets"]] == lines["steps"]
    with client(bi_scorer) as c:  # a model trained on given steps: auto cuts, and says so
        auto = c.post("/v1/score", json={"question": Q, "solution": text}).json()
    assert auto["segmenter"] == "auto" and len(auto["steps"]) == 2 and "given steps" in auto["segmenter_fallback"]


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/v1/score", {"steps": STEPS}, "field 'question'"),
        ("/v1/score", {"question": Q, "steps": STEPS, "solution": "x"}, "exactly one of 'steps' and 'solution'"),
        ("/v1/score", [{"question": Q, "steps": STEPS}, {"question": Q, "steps": []}], "item 1: field 'steps'"),
        (
            "/v1/score",
            {"question": Q, "solution": "a", "split": "words"},
            "field 'split': unknown segmenter 'words'",
        ),
        (
            "/v1/score",
            [{"question": Q, "steps": STEPS}, {"question": Q, "solution": "a", "segmenter": "tokens:0"}],
            "item 1: field 'segmenter': segmenter 'tokens:0': tokens:N needs a whole number N > 0",
        ),
        ("/v1/score", {"question": Q, "solution": " \n "}, "item 0: field 'solution': the trace is empty"),
        (
            "/v1/score",
            {"question": Q, "solution": "a", "segmenter": "given"},
            "item 0: field 'solution': segmenter 'given' keeps",
        ),
        ("/v1/score", {"question": Q, "steps": ["ok"], "colour": 1}, "field 'colour'"),
        ("/get_reward", {"query": ["a"]}, "field 'prompts'"),
        ("/get_reward", {"query": ["ab", "cd"], "prompts": ["a"]}, "field 'prompts' has 1 entries for 2"),
        (
            "/get_reward",
            {"query": ["ab"], "prompts": ["x"]},
            "field 'query' [0] does not start with field 'prompts' [0]",
        ),
        ("/get_reward", {"query": ["  ab"], "prompts": ["  "]}, "field 'prompts' [0] is empty"),
        ("/v1/score", {"question": Q, "steps": ["a", " "]}, "item 0: field 'steps' has an empty step at index 1"),
        ("/v1/score", {"question": "  ", "steps": ["a"]}, "item 0: field 'question' is missing or empty"),
        ("/v1/score", [], "empty list"),
    ],
)
def test_bad_requests_get_a_400_that_names_the_field(bi_scorer, path, body, message):
    with client(bi_scorer) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400 and message in r.json()["error"], r.json()
    assert "\n" not in r.json()["error"]


def test_invalid_json_and_step_tag_text_are_400s(bi_scorer):
    with client(bi_scorer) as c:
        for path in ("/v1/score", "/get_reward"):
            for body in (b"{not json", b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe"):
                r = c.post(path, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 400 and r.json() == {"error": "the body is not valid JSON"}
        tag = bi_scorer.tokenizer.convert_ids_to_tokens(bi_scorer.model.config.step_tag_id)
        r = c.post("/v1/score", json={"question": Q, "steps": [f"a {tag} b"]})
    assert r.status_code == 400 and "item 0" in r.json()["error"] and "step tag" in r.json()["error"]


def test_over_long_input_is_flagged_or_refused(bi_scorer):
    enc = bi_scorer.encoder.encode(Trajectory(Q, STEPS))
    fits_two = enc.n_tokens - len(enc.steps[-1])
    with client(bi_scorer, max_length=fits_two) as c:
        r = c.post("/v1/score", json={"question": Q, "steps": STEPS}).json()
    assert r["truncated"] is True and r["steps_scored"] == 2 and len(r["fused"]) == 2 and r["steps"] == STEPS
    assert (r["n_dropped"], r["first_scored"], r["windowed"]) == (1, 0, False)
    with client(bi_scorer, max_length=fits_two, overlength="tail") as c:  # the answer says which steps were scored
        r = c.post("/v1/score", json={"question": Q, "steps": STEPS}).json()
    assert (r["truncated"], r["steps_scored"], r["n_dropped"], r["first_scored"]) == (True, 2, 1, 1)
    with client(bi_scorer, max_length=fits_two, overlength="window") as c:
        r = c.post("/v1/score", json={"question": Q, "steps": STEPS}).json()
    assert (r["truncated"], r["steps_scored"], r["n_dropped"], r["windowed"]) == (False, 3, 0, True)
    with client(bi_scorer, max_length=fits_two, on_overlength="refuse") as c:
        r = c.post("/v1/score", json={"question": Q, "steps": STEPS})
    assert r.status_code == 413 and "1 trailing steps" in r.json()["error"]


def test_each_solution_is_encoded_once_and_the_scorer_sets_max_length(bi_scorer, monkeypatch):
    from biprm.data.encoding import Encoder

    calls = []
    real = Encoder.encode
    monkeypatch.setattr(
        Encoder, "encode", lambda self, traj, where="trajectory": calls.append(where) or real(self, traj, where)
    )
    with client(bi_scorer) as c:
        c.post("/v1/score", json=[{"question": Q, "steps": STEPS}, {"question": Q, "steps": STEPS[:2]}])
        c.post("/get_reward", json={"query": [Q + " 3 + 4 = 7."], "prompts": [Q]})
    assert calls == ["item 0", "item 1", "field 'query' [0]"]
    with pytest.raises(ValueError, match="--max-length 64"):
        build_app(bi_scorer, ServeConfig(model="tiny", max_length=64))


def test_health_and_metrics(bi_scorer):
    with client(bi_scorer) as c:
        c.post("/v1/score", json={"question": Q, "steps": STEPS})
        health = c.get("/health").json()
        metrics = c.get("/metrics").text
    assert health == {"status": "ok", "mode": "bi", "queued": 0}  # no model path: /health answers without the API key
    assert "biprm_requests_total 1" in metrics and "biprm_solutions_total 1" in metrics
    assert 'biprm_latency_seconds{quantile="0.99"}' in metrics and "biprm_queue_solutions 0" in metrics


def test_an_api_key_guards_every_endpoint_but_health(bi_scorer, monkeypatch):
    body = {"question": Q, "steps": STEPS}
    with client(bi_scorer, api_key="s3cret") as c:
        refused = [
            c.post("/v1/score", json=body),
            c.post("/v1/score", json=body, headers={"Authorization": "Bearer wrong"}),
            c.post("/v1/score", json=body, headers={"Authorization": "s3cret"}),
            c.post("/get_reward", json={"query": [Q], "prompts": [Q]}),
            c.get("/metrics"),
            c.get("/docs"),
            c.get("/openapi.json"),
            c.get("/no-such-page"),
        ]
        health = c.get("/health")
        ok = c.post("/v1/score", json=body, headers={"Authorization": "Bearer s3cret"})
    for r in refused:
        assert (
            r.status_code == 401
            and r.headers["www-authenticate"] == "Bearer"
            and "Authorization: Bearer" in r.json()["error"]
        ), r.request.url
    assert health.status_code == 200 and ok.status_code == 200
    assert ok.json()["fused"] == pytest.approx(scored(bi_scorer, [Trajectory(Q, STEPS)]).prob().tolist(), abs=1e-6)
    monkeypatch.setenv("BIPRM_API_KEY", "from-env")
    assert (
        ServeConfig(model="tiny").api_key == "from-env" and ServeConfig(model="tiny", api_key="flag").api_key == "flag"
    )
    with pytest.raises(ValueError, match="--api-key is empty"):
        ServeConfig(model="tiny", api_key="")


def fake_scores(trajs: list[Trajectory]) -> StepScores:
    """Score of step j of a trajectory = its question's number + j / 10, so slices can be checked."""
    lengths = [len(t.steps) for t in trajs]
    fused = np.concatenate([float(t.question) + np.arange(len(t.steps)) / 10 for t in trajs])
    return StepScores(np.concatenate([[0], np.cumsum(lengths)]), fused)


def test_concurrent_requests_share_calls_and_each_gets_its_own_slice():
    calls = []

    def score(trajs):
        calls.append(len(trajs))
        time.sleep(0.02)
        return fake_scores(trajs)

    async def main():
        batcher = Batcher(score, max_wait_ms=20, max_batch_tokens=10**9)
        batcher.start()
        reqs = [[Trajectory(str(i), ["a"] * (1 + i % 3)), Trajectory(str(i + 100), ["b"])] for i in range(30)]
        out = await asyncio.gather(*(batcher.submit(r, 10) for r in reqs))
        await batcher.stop()
        return reqs, out

    reqs, out = asyncio.run(main())
    assert sum(calls) == 60 and len(calls) < 10  # 30 requests, far fewer model calls
    for req, scores in zip(reqs, out):
        assert scores.fused.tolist() == fake_scores(req).fused.tolist()


def test_a_full_queue_refuses_at_once_and_a_failed_batch_fails_only_its_requests():
    release, taken = threading.Event(), threading.Event()

    def score(trajs):
        taken.set()
        release.wait(5)
        if any(t.question == "-1" for t in trajs):
            raise RuntimeError("model failure")
        return fake_scores(trajs)

    async def main():
        batcher = Batcher(score, max_wait_ms=0, max_queue=2)
        batcher.start()
        first = asyncio.create_task(batcher.submit([Trajectory("1", ["a"])], 1))
        for _ in range(500):  # until the worker took it: the queue is empty, the model busy
            if taken.is_set():
                break
            await asyncio.sleep(0.01)
        waiting = [asyncio.create_task(batcher.submit([Trajectory(q, ["a"])], 1)) for q in ("2", "-1")]
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        with pytest.raises(Overloaded, match="limit 2"):
            await batcher.submit([Trajectory("3", ["a"])], 1)
        refused_in = time.perf_counter() - started
        release.set()
        results = await asyncio.gather(first, *waiting, return_exceptions=True)
        await batcher.stop()
        return refused_in, results, batcher.stats

    refused_in, results, stats = asyncio.run(main())
    assert refused_in < 1.0 and stats.rejected == 1  # at once, not when the model frees up (up to 5 s later)
    assert results[0].fused.tolist() == [1.0]
    assert isinstance(results[1], RuntimeError) and isinstance(results[2], RuntimeError)  # batched together
    assert stats.failed == 2


def test_overload_is_a_503_with_retry_after_and_an_oversized_request_a_413(bi_scorer):
    with client(bi_scorer, max_queue=2) as c:
        c.app.state.service.batcher.queued = 1  # one solution already waiting
        r = c.post("/v1/score", json=[{"question": Q, "steps": STEPS}] * 2)
        c.app.state.service.batcher.queued = 0
        too_big = c.post("/v1/score", json=[{"question": Q, "steps": STEPS}] * 3)
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "limit 2" in r.json()["error"]
    assert too_big.status_code == 413 and "at most 2 solutions per request" in too_big.json()["error"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_scorer_that_raises_stopiteration_fails_its_batch_and_the_worker_goes_on():
    calls = []

    def score(trajs):
        calls.append(len(trajs))
        if len(calls) == 1:
            raise StopIteration  # asyncio cannot carry it back from the executor: unwrapped, the await never returned
        return fake_scores(trajs)

    async def main():
        batcher = Batcher(score, max_wait_ms=0)
        batcher.start()
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(batcher.submit([Trajectory("1", ["a"])], 1), 10)
        second = await asyncio.wait_for(batcher.submit([Trajectory("1", ["a"])], 1), 10)
        await batcher.stop()
        return second, batcher.stats

    second, stats = asyncio.run(main())
    assert second.fused.tolist() == [1.0] and stats.failed == 1


@pytest.mark.slow
def test_cli_server_finishes_accepted_requests_on_sigterm(tmp_path, bi_scorer):
    ckpt = tmp_path / "ckpt"
    bi_scorer.model.save_pretrained(ckpt)
    bi_scorer.tokenizer.save_pretrained(ckpt)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    server = subprocess.Popen(
        [sys.executable, "-m", "biprm.cli", "serve", "--model", str(ckpt), "--port", str(port), "--max-wait-ms", "200"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        answers = []

        def call():
            req = urllib.request.Request(
                url + "/v1/score",
                json.dumps({"question": Q, "steps": STEPS}).encode(),
                {"content-type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                answers.append(json.loads(r.read()))

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for _ in range(300):  # until the server has accepted all six (they wait in its 200 ms batching window)
            if "biprm_requests_total 6" in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode():
                break
            time.sleep(0.01)
        server.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert server.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down cleanly
        log = server.stdout.read().decode()
    finally:
        server.kill()
    want = scored(bi_scorer, [Trajectory(Q, STEPS)]).prob().tolist()
    assert "Finished server process" in log and "Traceback" not in log, log
    assert len(answers) == 6 and all(a["fused"] == pytest.approx(want, abs=1e-6) for a in answers)
