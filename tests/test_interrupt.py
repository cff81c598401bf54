"""Ctrl-C: a `biprm` command stops with one line saying what it keeps and how to go on (rc 130), and a training run
interrupted so saves its step, from which --resume goes on."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from biprm.cli import main
from biprm.training import default_save_steps
from test_kill import train_flags

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_without_save_steps_saves_every_tenth_of_its_steps_at_most_500():
    assert [default_save_steps(n) for n in (1, 9, 40, 250, 4999, 5000, 10**6)] == [1, 1, 4, 25, 500, 500, 500]


def test_ctrl_c_in_train_saves_the_step_under_way_in_one_line_and_resume_goes_on_from_it(tmp_path, caplog):
    """The README's train command, shortened to 40 steps: its default interval saves checkpoint-4, and SIGINT after it
    saves the step under way, which --resume takes. Both runs take one thread: two on a busy 2-core machine train
    the tiny model ten times slower."""
    import torch

    out = tmp_path / "run"
    flags = train_flags(out, max_steps=40, save_steps=None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "biprm.cli", *flags],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "checkpoint-4" / "trainer_state.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "finished or stuck before the first checkpoint"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    saved = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert 4 < saved < 40 and not (out / "config.json").exists()  # the step under way, not the final model
    assert err.strip().splitlines()[-1] == (
        f"biprm train: interrupted; {out}/checkpoint-{saved} is saved: the same command "
        f"with --resume goes on from its step {saved}"
    )
    assert "Traceback" not in err
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with caplog.at_level(logging.WARNING):
            main([*flags, "--resume"])
    finally:
        torch.set_num_threads(threads)
    assert f"resuming from {out}/checkpoint-{saved}" in caplog.text
    assert json.loads((out / "checkpoint-40" / "trainer_state.json").read_text())["global_step"] == 40


@pytest.mark.parametrize(
    "output, kept",
    [
        (
            "scores.jsonl",
            "2 scored rows are kept in {tmp}/scores.jsonl.parts: the same command with --resume goes on from there",
        ),
        ("-", "what went to stdout is all it keeps (a run into an --output file can --resume)"),
    ],
)
def test_ctrl_c_in_score_says_what_it_keeps_in_one_line(tmp_path, monkeypatch, capsys, output, kept):
    def interrupted(model, source, output, **options):
        if output != "-":
            Path(output + ".parts").mkdir()
            Path(output + ".parts", "part-00000-of-00001.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a"')
        raise KeyboardInterrupt

    monkeypatch.setattr("biprm.scoring.score_file.score_file", interrupted)
    output = output if output == "-" else str(tmp_path / output)
    with pytest.raises(SystemExit) as stop:
        main(["score", "--model", str(tmp_path), "--input", "synthetic:4", "--output", output])
    assert stop.value.code == 130
    assert capsys.readouterr().err == f"biprm score: interrupted; {kept.format(tmp=tmp_path)}\n"
