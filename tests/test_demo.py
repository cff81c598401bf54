"""The demo's table is the same on any thread count: `run_demo` pins torch's threads and its deterministic algorithms,
and gives the caller's settings back."""

import json

import pytest
import torch

import biprm.demo
from biprm.config import DemoConfig
from biprm.demo import DEMO_THREADS, run_demo


def test_the_demo_trains_on_its_own_thread_count_and_gives_the_callers_back(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(
        biprm.demo,
        "demo",
        lambda cfg: seen.append((torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())),
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(DEMO_THREADS + 1)
        run_demo(DemoConfig(output_dir=str(tmp_path)))
        assert seen == [(DEMO_THREADS, True)]
        assert torch.get_num_threads() == DEMO_THREADS + 1 and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.set_num_threads(before)


def demo_on(threads: int, out) -> tuple[dict, bytes]:
    """The toy demo's results.json, less each mode's CPU time, and l2r's trained weights, run from a process whose torch
    uses `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run_demo(
            DemoConfig(
                output_dir=str(out),
                modes="l2r,bi",
                n_train=32,
                n_test=16,
                bon_questions=4,
                bon_candidates=8,
                epochs=1.0,
                batch_size=8,
            )
        )
    finally:
        torch.set_num_threads(before)
    written = json.loads((out / "results.json").read_text())
    for r in written["results"].values():
        r.pop("cpu_seconds")
    return written, (out / "l2r" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_the_toy_demo_gives_the_same_numbers_and_weights_on_one_thread_and_on_two(tmp_path):
    one, two = demo_on(1, tmp_path / "one"), demo_on(2, tmp_path / "two")
    assert one[0] == two[0]
    assert one[1] == two[1]
