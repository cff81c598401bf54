"""Each study's --report-only reproduces its committed tables byte for byte, from the committed runs alone.

The committed results folder is copied aside and its report rewritten there by the study's own command, so a change
anywhere in biprm that moves a committed number fails here instead of silently in the next rerun of a study."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from biprm.cli import run_program

ROOT = Path(__file__).resolve().parents[2]
STUDIES = {  # id: (study, config file, committed results folder, needs the benchmark data)
    "rl": ("rl", "study.yaml", "results", False),
    "replication-quick": ("replication", "quick.yaml", "results/quick", True),
    "replication-full": ("replication", "full.yaml", "results/full", True),
    "mechanism-v1": ("mechanism", "v1.yaml", "results/v1", True),
    "mechanism-v2": ("mechanism", "v2.yaml", "results/v2", True),
}


def close(a, b) -> bool:
    """JSON values equal up to the last bits of a float (a sum's order differs across machines)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return bool(np.isclose(a, b, rtol=1e-12, atol=1e-12))
    return a == b


@pytest.mark.parametrize("case", sorted(STUDIES))
def test_report_only_reproduces_the_committed_tables(case, tmp_path, request, capsys):
    from studies.mechanism.__main__ import main as mechanism
    from studies.mechanism.config import MechanismConfig
    from studies.replication.__main__ import main as replication
    from studies.replication.config import ReplicateConfig
    from studies.rl.__main__ import main as rl
    from studies.rl.config import RLStudyConfig

    study, config, results, needs_data = STUDIES[case]
    argv = ["--config", str(ROOT / "studies" / study / config), "--report-only", "--out", str(tmp_path / "out")]
    if needs_data:
        argv += ["--data-root", str(request.getfixturevalue("data_dir"))]
    committed = ROOT / "studies" / study / results
    shutil.copytree(committed, tmp_path / "out")
    settings, recipe = {
        "rl": (RLStudyConfig, rl),
        "replication": (ReplicateConfig, replication),
        "mechanism": (MechanismConfig, mechanism),
    }[study]
    run_program(settings, recipe, f"python -m studies.{study}", argv)
    printed = capsys.readouterr().out  # a summary on screen, not only "wrote report.md"
    assert printed.count("\n|") >= 3 and len(printed.splitlines()) > 5, printed
    assert (tmp_path / "out" / "report.md").read_text() == (committed / "report.md").read_text()
    if (committed / "results.json").is_file():
        assert close(
            json.loads((tmp_path / "out" / "results.json").read_text()),
            json.loads((committed / "results.json").read_text()),
        )


@pytest.mark.parametrize("kept", ["gsm8k-study", "gsm8k-study-gpu"])
def test_the_search_studys_summary_comes_back_from_its_records_alone(kept, tmp_path):
    from studies.search_gsm8k.records import report

    committed = ROOT / "studies" / "search_gsm8k" / "results" / kept
    shutil.copytree(committed, tmp_path / kept)
    report(tmp_path / "unused", tmp_path / kept)
    assert (tmp_path / kept / "summary.md").read_text() == (committed / "summary.md").read_text()
    assert close(
        json.loads((tmp_path / kept / "summary.json").read_text()), json.loads((committed / "summary.json").read_text())
    )


HASH_SEEDS = ("1", "2")  # set and dict orders of strings differ between these


def written_twice(command: list[str], committed: Path, tmp_path: Path) -> list[dict[str, bytes]]:
    """Every JSON and Markdown file of `committed` after `command` (which names the folder as {out}) rewrote a copy of
    it, once under each hash seed; the two runs go side by side."""
    outs = [tmp_path / f"hash{seed}" for seed in HASH_SEEDS]
    runs = []
    for seed, out in zip(HASH_SEEDS, outs):
        shutil.copytree(committed, out)
        env = {**os.environ, "PYTHONHASHSEED": seed}
        argv = [a.replace("{out}", str(out)) for a in command]
        runs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        for run in runs:
            assert run.wait(timeout=600) == 0, run.stderr.read().decode()[-2000:]
    finally:
        for run in runs:
            run.kill()
    return [
        {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*")) if f.suffix in (".json", ".md")}
        for out in outs
    ]


@pytest.mark.parametrize(
    "case",  # the studies that read the benchmark data take 10-20 s a report: slow
    [pytest.param(c, marks=[pytest.mark.slow] if STUDIES[c][3] else []) for c in sorted(STUDIES)],
)
def test_report_only_writes_the_same_bytes_under_any_hash_seed(case, tmp_path, request):
    study, config, results, needs_data = STUDIES[case]
    command = [sys.executable, "-m", f"studies.{study}", "--config", f"studies/{study}/{config}", "--report-only"]
    command += ["--out", "{out}"]
    if needs_data:
        command += ["--data-root", str(request.getfixturevalue("data_dir"))]
    first, second = written_twice(command, ROOT / "studies" / study / results, tmp_path)
    assert first.keys() == second.keys() and [k for k in first if first[k] != second[k]] == []


@pytest.mark.parametrize("kept", ["gsm8k-study", "gsm8k-study-gpu"])
def test_the_search_summary_is_the_same_bytes_under_any_hash_seed(kept, tmp_path):
    command = [sys.executable, "-m", "studies.search_gsm8k.records", "report", "--run", "unused", "--keep", "{out}"]
    first, second = written_twice(command, ROOT / "studies" / "search_gsm8k" / "results" / kept, tmp_path)
    assert first.keys() == second.keys() and [k for k in first if first[k] != second[k]] == []
