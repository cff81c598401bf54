"""`biprm check --smoke`: the GPU check's every item, run for real on the tiny backbone on the CPU."""
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_check_smoke_runs_every_item_and_passes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "biprm.cli", "check", "--smoke", "--out", str(tmp_path), "--latency-solutions", "4"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    items = {i["name"]: i for i in json.loads((tmp_path / "check.json").read_text())}
    assert list(items) == ["train 3 steps", "resume", "score", "latency bi/l2r", "vllm export dtype"]
    assert {n: i["status"] for n, i in items.items()} == {
        "train 3 steps": "pass", "resume": "pass", "score": "pass", "latency bi/l2r": "info", "vllm export dtype": "pass"}
    assert "heads saved as ['F32']" in items["train 3 steps"]["detail"]
    assert "from checkpoint-2" in items["resume"]["detail"]
    assert (tmp_path / "check.md").read_text().startswith("| item | status | measured |")


def test_a_failed_training_run_skips_the_rest_and_fails_the_check(tmp_path):
    from biprm.bench.check import run_check
    from biprm.bench.config import CheckConfig

    items = run_check(CheckConfig(smoke=True, data="no/such/file.jsonl", out=str(tmp_path)))
    assert [i.status for i in items] == ["fail", "skip", "skip", "skip", "skip"]
    assert "train.log" in items[0].detail
