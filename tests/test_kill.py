"""Real kills: a `biprm` subprocess is SIGKILLed at a chosen moment, and a rerun with --resume
finishes with what an uninterrupted run gives."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from biprm.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def kill_when(cmd: list[str], ready, timeout: float = 300) -> None:
    """Start `cmd`, SIGKILL it as soon as `ready()` holds; fail if it finishes first."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=err
        )
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                err.seek(0)
                pytest.fail("finished or stuck before the kill: " + err.read().decode()[-2000:])
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def train_flags(out: Path, max_steps: int = 32, save_steps: int | None = 4) -> list[str]:
    """A short tiny `biprm train` run; `save_steps` None leaves the checkpoint interval to its default."""
    saves = [] if save_steps is None else ["--save-steps", str(save_steps), "--save-total-limit", "3"]
    return [
        "train",
        "--backbone",
        "tiny",
        "--data",
        "synthetic:64",
        "--output-dir",
        str(out),
        "--batch-size",
        "4",
        "--grad-accum",
        "1",
        "--max-steps",
        str(max_steps),
        "--lr",
        "1e-3",
        *saves,
        "--no-show-progress",
    ]


def test_training_killed_mid_run_resumes_to_the_uninterrupted_result(tmp_path, caplog, monkeypatch):
    """The killed run's subprocess has one thread; so do the resume and the whole run here, since a matrix product
    summed by two threads differs in its last bits, and that difference, not the resume, would then be compared."""
    import logging

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    killed = tmp_path / "killed"
    kill_when([sys.executable, "-m", "biprm.cli", *train_flags(killed)], lambda: any(killed.glob("checkpoint-8")))
    assert not (killed / "config.json").exists()  # no final model yet
    with caplog.at_level(logging.WARNING):
        main([*train_flags(killed), "--resume"])
    assert "resuming from" in caplog.text
    main(train_flags(tmp_path / "whole"))
    a, b = load_file(killed / "model.safetensors"), load_file(tmp_path / "whole" / "model.safetensors")
    assert a.keys() == b.keys()
    torch.set_num_threads(threads)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=1e-6, err_msg=name)


def test_scoring_killed_mid_file_resumes_to_the_same_output(tmp_path):
    from biprm.config import TrainConfig
    from biprm.training import train

    ckpt = train(
        TrainConfig(
            backbone="tiny",
            data="synthetic:16",
            max_steps=1,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            output_dir=str(tmp_path / "ckpt"),
            save_steps=10**9,
            show_progress=False,
        )
    )
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {"prompt": f"What is {k} + {k}?", "completions": [f"{k} + {k} = {2 * k}", f"The answer is {2 * k}."]}
            )
            for k in range(1200)
        )
    )
    flags = ["score", "--model", ckpt, "--input", str(rows), "--chunk", "50"]
    out = tmp_path / "out.jsonl"

    def two_chunks_written() -> bool:
        return any(p.read_bytes().count(b"\n") >= 200 for p in (tmp_path / "out.jsonl.parts").glob("part-*.jsonl"))

    kill_when([sys.executable, "-m", "biprm.cli", *flags, "--output", str(out)], two_chunks_written)
    assert not out.exists()
    main([*flags, "--output", str(out), "--resume"])
    main([*flags, "--output", str(tmp_path / "whole.jsonl")])
    assert out.read_text() == (tmp_path / "whole.jsonl").read_text()
