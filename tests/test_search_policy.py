"""Step policies and their faults: a failing or unreachable server, a policy that never emits the step token."""

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from biprm.search.algorithms import Search, beam_search, sample
from biprm.search.config import SearchConfig
from biprm.search.noise import NoiseScorer
from biprm.search.policy import HFPolicy, PolicyError, ServerPolicy, close_step, cut_solution
from biprm.search.run import run_search
from search_scripted import ScriptedScorer


class Words:
    """A tokenizer stand-in: no chat template, one token per word."""

    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return text.split()

    def decode(self, ids):
        return " ".join(ids)


def choice(i, text, finish="stop", stop_reason=None):
    return {"index": i, "text": text, "finish_reason": finish, "stop_reason": stop_reason}


class Stub:
    """A local /v1/completions server that answers from a script: an int is an HTTP error status, a callable builds
    the choices from the request body; the last entry repeats."""

    def __init__(self, script):
        self.script, self.bodies = list(script), []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                step = stub.script.pop(0) if len(stub.script) > 1 else stub.script[0]
                if isinstance(step, int):
                    self.send_error(step)
                    return
                data = json.dumps({"choices": step(body), "usage": {}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub(request):
    servers = []

    def start(*script):
        servers.append(Stub(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def answers(body):
    return [choice(i, "The answer is 3") for i in range(len(body["prompt"]) * body["n"])]


def test_server_retries_a_500_then_gives_the_steps(stub):
    server = stub(500, answers)
    policy = ServerPolicy(server.url, "m", Words(), backoff=0.01)
    outs = policy.generate_step(["q1", "q2"], 2)
    assert [(o.text, o.finished, o.capped, o.tokens) for o in outs] == [("The answer is 3", True, False, 4)] * 4
    assert len(server.bodies) == 2 and policy.calls == 1 and policy.tokens == 16
    assert server.bodies[1]["stop"] == ["\n\n"] and server.bodies[1]["max_tokens"] == 256


def test_a_server_that_keeps_failing_gives_one_error_naming_url_and_status(stub):
    server = stub(503)
    with pytest.raises(PolicyError, match=rf"policy server {server.url}/v1/completions: HTTP 503 .* after 3 attempts"):
        ServerPolicy(server.url, "m", Words(), retries=2, backoff=0.01).generate_step(["q"], 1)


def test_an_unreachable_server_gives_one_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the call: nothing listens there
    with pytest.raises(PolicyError, match=rf"policy server http://127.0.0.1:{port}/v1/completions: unreachable"):
        ServerPolicy(f"http://127.0.0.1:{port}", "m", Words(), retries=1, backoff=0.01).generate_step(["q"], 1)


def three_questions(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "3"}) + "\n" for i in range(3)))
    return data


def test_a_server_failing_mid_run_keeps_the_finished_questions(stub, tmp_path):
    server = stub(answers, 500)  # the first batch's one level succeeds, then the server fails for good
    cfg = SearchConfig(
        out=str(tmp_path / "out"),
        data=str(three_questions(tmp_path)),
        algorithms=["bon"],
        n=[2],
        batch_questions=2,
        grade_workers=0,
    )
    with pytest.raises(PolicyError, match="HTTP 500"):
        run_search(cfg, ServerPolicy(server.url, "m", Words(), retries=1, backoff=0.01), [NoiseScorer()])
    assert [json.loads(line)["index"] for line in (tmp_path / "out" / "questions.jsonl").read_text().splitlines()] == [
        0,
        1,
    ]


@pytest.mark.slow
def test_the_cli_prints_one_line_for_a_failing_server(stub, tmp_path):
    server = stub(answers, 500)
    data, out = three_questions(tmp_path), tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "biprm.cli",
        "search",
        "--out",
        str(out),
        "--data",
        str(data),
        "--policy",
        "server",
        "--policy-url",
        server.url,
        "--policy-tokenizer",
        "tiny",
        "--algorithms",
        "bon",
        "--n",
        "2",
        "--batch-questions",
        "2",
        "--retries",
        "1",
        "--grade-workers",
        "0",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"biprm search: error: policy server {server.url}/v1/completions: HTTP 500")
    )
    assert [json.loads(line)["index"] for line in (out / "questions.jsonl").read_text().splitlines()] == [0, 1]


def test_endings_from_the_server_reasons():
    assert close_step("Step one\n\n", "end", 3) == close_step("Step one", "step", 3)  # the token kept in the text
    out = close_step("Step one and on and on", "cap", 5)
    assert out.capped and not out.finished
    assert close_step("  \n", "step", 1).finished  # an empty step ends the solution
    policy = ServerPolicy("http://x", "m", Words())
    assert [policy._ending(choice(0, "t", *r)) for r in [("stop", None), ("stop", "\n\n"), ("length", None)]] == [
        "end",
        "step",
        "cap",
    ]
    listed = {**choice(0, "three words here"), "logprobs": {"tokens": ["three wo", "rds here"]}}
    assert (
        policy._tokens(listed) == 2 and policy._tokens(choice(0, "three words here")) == 3
    )  # the server's tokens, else re-encoded


def test_a_policy_that_never_emits_the_step_token_is_capped_and_stops_at_the_depth_cap(stub):
    server = stub(lambda body: [choice(i, "and then " * 5, "length") for i in range(len(body["prompt"]) * body["n"])])
    policy = ServerPolicy(server.url, "m", Words(), max_step_tokens=10)
    s = Search(["q"], policy, ScriptedScorer({"and then and then and then and then and then": 0.0}), max_depth=3)
    kept = beam_search(s, 2, 1)
    assert kept[0].finished and kept[0].capped == (True, True, True) and len(kept[0].steps) == 3
    assert policy.calls == 3


@pytest.mark.slow
def test_transformers_policy_caps_a_step_and_renders_the_partial_solution():
    policy = HFPolicy.from_pretrained("tiny", max_step_tokens=4, step_token="@@never@@", temperature=0.0)
    # a random model's greedy step may hit end-of-sequence within 4
    # tokens, and whether it does can turn on rounding: forbid it
    policy.model.generation_config.suppress_tokens = [policy.tokenizer.eos_token_id]
    outs = policy.generate_step([policy.prompt("What is 2 + 2?", ["First step."])], 2)
    assert (
        policy.prompt("Q", ["a", "b"]) == "Q@@never@@a@@never@@b@@never@@"
    )  # no chat template: question, then the steps
    assert len(outs) == 2 and all(o.capped and not o.finished and o.tokens == 4 for o in outs)


def steps_of(outs):
    return [(o.text, o.finished, o.capped, o.tokens) for o in outs]


def test_a_solution_drawn_whole_is_cut_where_a_step_by_step_draw_closes_its_steps():
    words, text = Words(), "a b\n\nc d e f g\n\nh"  # 8 words; the call generated 11 tokens (step tokens, say)
    # "c d e f g" runs past the cap of 3: "c d e" is closed there, capped, and "f g" goes on as the next step
    assert steps_of(cut_solution(text, "end", 11, words, 10, 3)) == [
        ("a b", False, False, 2),
        ("c d e", False, True, 3),
        ("f g", False, False, 2),
        ("h", True, False, 4),
    ]
    # the depth cap ends it: the last kept step takes every token generated after the ones before it
    assert steps_of(cut_solution(text, "end", 11, words, 2, 3)) == [("a b", False, False, 2), ("c d e", True, True, 9)]
    assert steps_of(cut_solution("a\n\n\n\nb", "end", 3, words, 10, 3)) == [
        ("a", True, False, 3)
    ]  # an empty step ends it
    assert steps_of(cut_solution("a\n\nb c", "cap", 3, words, 10, 3)) == [
        ("a", False, False, 1),
        ("b c", True, True, 2),
    ]  # the call's cap
    assert steps_of(cut_solution("  ", "end", 1, words, 10, 3)) == [("", True, False, 1)]


def test_a_whole_draw_is_cut_again_by_a_segmenter_within_the_depth_and_keeps_its_tokens():
    from biprm.data.segment import Segmenter
    from biprm.search.policy import StepOut, recut

    drawn = [
        StepOut("a\nb\nc", False, False, 6),
        StepOut("d", True, True, 4),
    ]  # text "a\nb\nc\n\nd": 9 characters, 10 tokens
    lines = Segmenter("lines")
    # four lines; tokens by characters up to the next step: a 10*2//9 = 2, b 2, c 10*3//9 = 3, d the rest 3
    assert steps_of(recut(drawn, lines, "\n\n", 10)) == [
        ("a", False, False, 2),
        ("b", False, False, 2),
        ("c", False, False, 3),
        ("d", True, True, 3),
    ]
    # at most 3 steps: the third holds the rest of the text, and the rest of the tokens
    assert steps_of(recut(drawn, lines, "\n\n", 3)) == [
        ("a", False, False, 2),
        ("b", False, False, 2),
        ("c\n\nd", True, True, 6),
    ]
    assert steps_of(recut([StepOut("", True, False, 1)], lines, "\n\n", 3)) == [
        ("", True, False, 1)
    ]  # empty stays empty
    with pytest.raises(ValueError, match="--segmenter lines: cuts a solution drawn whole"):
        SearchConfig(out="x", data="gsm8k", segmenter="lines")
    with pytest.raises(ValueError, match="unknown segmenter 'words'"):
        SearchConfig(out="x", data="gsm8k", pool_draw="whole", segmenter="words")


def test_a_whole_draw_is_one_call_with_no_stop_and_gives_finished_paths(stub):
    server = stub(lambda body: [choice(i, "x y\n\nThe answer is 3") for i in range(len(body["prompt"]) * body["n"])])
    policy = ServerPolicy(server.url, "m", Words(), max_step_tokens=10)
    s = Search(["q1", "q2"], policy, NoiseScorer(), max_depth=4)
    pool = sample(s, 3, whole=True)
    assert server.bodies[0]["stop"] == [] and server.bodies[0]["max_tokens"] == 4 * 12 and server.bodies[0]["n"] == 3
    assert policy.calls == 1 and [p.q for p in pool] == [0, 0, 0, 1, 1, 1]
    assert all(p.finished and p.steps == ("x y", "The answer is 3") and p.tokens == 6 for p in pool)
    assert s.budget.row(0)["policy_tokens"] == 18 and s.budget.row(1)["policy_calls"] == 1


def test_the_synthetic_policy_cannot_draw_whole():
    with pytest.raises(ValueError, match="--pool-draw whole"):
        SearchConfig(out="x", data="synthetic:4", policy="synthetic", pool_draw="whole")


def test_a_run_that_draws_its_pool_whole_grades_and_records_it(stub, tmp_path):
    server = stub(lambda body: [choice(i, "x y\n\nThe answer is 3") for i in range(len(body["prompt"]) * body["n"])])
    cfg = SearchConfig(
        out=str(tmp_path / "out"),
        data=str(three_questions(tmp_path)),
        algorithms=["bon"],
        n=[2],
        batch_questions=2,
        grade_workers=0,
        pool_draw="whole",
    )
    run_search(cfg, ServerPolicy(server.url, "m", Words()), [NoiseScorer()])
    rows = [json.loads(line) for line in (tmp_path / "out" / "questions.jsonl").read_text().splitlines()]
    assert len(server.bodies) == 2 and all(b["stop"] == [] for b in server.bodies)  # one call per batch of questions
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert all(p["steps"] == ["x y", "The answer is 3"] and p["correct"] for r in rows for p in r["pool"])


def test_hf_policy_state_keeps_every_gpus_generator(monkeypatch):
    """A pool resumed mid-way on a GPU draws as an uninterrupted one only if the GPU generators come back too."""
    import torch

    from biprm.search.policy import HFPolicy

    gpus = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(gpus))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: gpus.__setitem__(slice(None), states))
    policy = HFPolicy.__new__(HFPolicy)  # state and restore read no model
    saved = policy.state()
    assert saved["cuda_rng"] == [[1, 2, 3]]
    gpus[0] = torch.tensor([9, 9, 9], dtype=torch.uint8)
    policy.restore(saved)
    assert gpus[0].tolist() == [1, 2, 3]
