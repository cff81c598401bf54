"""`biprm serve` bounds: large bodies and texts are refused before they are read or tokenized,
and tokenizing happens beside the event loop, so a small request is never held up by a large one."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from biprm.serve.app import build_app  # noqa: E402
from biprm.serve.config import ServeConfig  # noqa: E402
from conftest import serving  # noqa: E402

Q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
STEPS = ["Tom starts with 3 apples.", "He buys 4 more, so 3 + 4 = 7.", "The answer is 7."]


def test_a_body_over_the_bound_is_a_413_before_it_is_parsed(bi_scorer):
    body = json.dumps({"question": Q, "steps": STEPS}).encode()
    with TestClient(build_app(bi_scorer, ServeConfig(model="tiny", max_body_bytes=len(body) - 1))) as c:
        for path in ("/v1/score", "/get_reward"):
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"] and "\n" not in r.json()["error"]
        chunked = c.post(
            "/v1/score", content=iter([body[:10], body[10:]]), headers={"content-type": "application/json"}
        )  # no content-length
    assert chunked.status_code == 413 and f"more than {len(body) - 1} bytes" in chunked.json()["error"]


def test_a_text_over_the_bound_is_a_413_naming_the_item_and_is_never_tokenized(bi_scorer, monkeypatch):
    seen = []
    encode = bi_scorer.encoder.encode
    monkeypatch.setattr(
        bi_scorer.encoder,
        "encode",
        lambda traj, where="": seen.append(len(traj.question) + sum(map(len, traj.steps))) or encode(traj, where),
    )
    with TestClient(build_app(bi_scorer, ServeConfig(model="tiny", max_text_chars=1000))) as c:
        big = c.post("/v1/score", json=[{"question": Q, "steps": STEPS}, {"question": Q, "steps": ["x" * 1000]}])
        free = c.post("/v1/score", json={"question": Q, "solution": "y" * 1000})
        reward = c.post("/get_reward", json={"query": [Q + "z" * 1000], "prompts": [Q]})
        ok = c.post("/v1/score", json={"question": Q, "steps": STEPS})
    assert (
        big.status_code == 413
        and big.json()["error"].startswith(f"item 1: {len(Q) + 1000} characters")
        and "--max-text-chars" in big.json()["error"]
    )
    assert free.status_code == 413 and free.json()["error"].startswith("item 0:")
    assert reward.status_code == 413 and reward.json()["error"].startswith("field 'query' [0]:")
    assert ok.status_code == 200 and seen and max(seen) < 1000  # only the accepted request was tokenized


def _post(url: str, body: dict, out: dict, key: str) -> None:
    started = time.perf_counter()
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out[key] = (r.status, time.perf_counter() - started)
    except urllib.error.HTTPError as error:
        out[key] = (error.code, time.perf_counter() - started)


def test_a_small_request_is_not_held_up_by_a_large_one_in_flight(bi_scorer, monkeypatch):
    """A tokenization that takes 3 s (simulated by a sleep, so the test does not depend on the
    machine's speed) runs beside the event loop: a small request sent during it is answered at once."""
    encode = bi_scorer.encoder.encode

    def slow_for_the_large(traj, where=""):
        if traj.question.startswith(
            "LARGE"
        ):  # on whatever thread tokenizes: on the event loop it would hold up the small one
            time.sleep(3)
        return encode(traj, where)

    monkeypatch.setattr(bi_scorer.encoder, "encode", slow_for_the_large)
    with serving(build_app(bi_scorer, ServeConfig(model="tiny"))) as base:
        url = f"{base}/v1/score"
        out: dict = {}
        _post(url, {"question": Q, "steps": STEPS}, out, "warm-up")
        large = threading.Thread(
            target=_post, args=(url, {"question": "LARGE " + Q, "steps": STEPS * 50}, out, "large")
        )
        large.start()
        time.sleep(0.5)  # the large request is being tokenized
        _post(url, {"question": Q, "steps": STEPS}, out, "small")
        large_done_first = "large" in out
        large.join(30)
    assert out["small"][0] == 200 and out["large"][0] == 200
    assert not large_done_first and out["small"][1] < 1.5, out
