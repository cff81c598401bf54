"""The demo's table is the same on any thread count: `run_demo` pins torch's threads and its deterministic algorithms,
and gives the caller's settings back."""

import json
import re
from pathlib import Path

import torch

import biprm.demo
from biprm.config import DemoConfig
from biprm.demo import DEMO_THREADS, picks_line, run_demo


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
    written["config"].pop("output_dir")
    return written, (out / "l2r" / "model.safetensors").read_bytes()


def test_the_toy_demo_gives_the_same_numbers_and_weights_on_one_thread_and_on_two(tmp_path):
    """End to end, byte for byte. At this size the caller's thread count does not reach the numbers even unpinned; the
    pin itself is held by the test above."""
    one, two = demo_on(1, tmp_path / "one"), demo_on(2, tmp_path / "two")
    assert one[0] == two[0]
    assert one[1] == two[1]


ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d+(?:\.\d+)?")


def demo_paragraph() -> str:
    """README.md's account of the demo's table: from "The demo writes" to the next section."""
    text = (ROOT / "README.md").read_text()
    start = text.index("The demo writes")
    return " ".join(text[start : text.index("\n## ", start)].split())


def demo_claims() -> list[str]:
    """The paragraph's numeric phrases, each written from the committed results/demo/results.json (its n keys read
    back as numbers, as the demo wrote them)."""
    written = json.loads(
        (ROOT / "results" / "demo" / "results.json").read_text(),
        object_hook=lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()},
    )
    cfg, results, text_free = written["config"], written["results"], written["reads_no_text"]
    ns = results["l2r"]["bon"]["ns"]
    at_n = lambda bon: " / ".join(f"{bon['bon'][n]:.1f}" for n in ns)  # noqa: E731
    rule = next(name for name in text_free if name.startswith("flag step"))
    return [
        f"{round(cfg['n_train'] * cfg['epochs'] / cfg['batch_size'])} steps of {cfg['batch_size']} solutions",
        "{:.0f} % right, {:.0f} % calc slips, {:.0f} % claims".format(*(100 * s for s in cfg["mix"])),
        f"first-error F1 on {cfg['n_test']} held-out solutions",
        f"over {cfg['bon_questions']} pools of {cfg['bon_candidates']}",
        f"{sum(r['cpu_seconds'] for r in results.values()):.0f} CPU s",
        f"n = {' / '.join(map(str, ns))}",
        *(f"`{mode}` {at_n(r['bon'])} (mean {r['bon']['mean']['bon']:.1f})" for mode, r in results.items()),
        f"random pick {at_n(text_free['random pick']['bon'])}",
        f"majority vote {at_n(text_free['majority vote (fair ties)']['bon'])}",
        *(f"`{mode}` {r['exact']['calc']:.1f} %" for mode, r in results.items()),
        f"{rule} {text_free[rule]['exact']['calc']:.1f} %",
        picks_line(results, text_free),
    ]


def test_every_number_in_the_readme_demo_paragraph_is_read_from_the_committed_results():
    text = demo_paragraph()
    missing = [c for c in demo_claims() if c not in text]
    assert not missing, f"README.md's demo paragraph does not say: {missing}"
    for c in demo_claims():
        text = text.replace(c, "")
    # what is left may hold only fixed words: the first-error threshold 0.5
    left = [n for n in NUMBER.findall(text) if n != "0.5"]
    assert not left, f"numbers in README.md's demo paragraph that results/demo/results.json does not back: {left}"
