"""Each study runs as `python -m studies.<name>`, parsed as every biprm command is, and its shipped files parse."""

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from biprm.cli import run_program

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(ROOT.glob("studies/*/*.yaml"))


def settings_of(name: str) -> type:
    from studies.mechanism.config import MechanismConfig
    from studies.replication.config import ReplicateConfig
    from studies.rl.config import RLStudyConfig

    return {"replication": ReplicateConfig, "mechanism": MechanismConfig, "rl": RLStudyConfig}[name]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_file_opens_with_its_command_and_parses_through_it(path):
    first = path.read_text().splitlines()[0]
    name = path.parent.name
    assert first.startswith(f"# python -m studies.{name} --config studies/{name}/{path.name}"), first
    seen = []
    argv = shlex.split(first.removeprefix(f"# python -m studies.{name} "))
    run_program(
        settings_of(name),
        seen.append,
        f"python -m studies.{name}",
        [a.replace(f"studies/{name}/{path.name}", str(path)) for a in argv],
    )
    written = yaml.safe_load(path.read_text())
    fields = {f.name for f in dataclasses.fields(seen[0])}
    assert set(written) <= fields | {"train_top_layers"}, set(written) - fields
    same = [k for k in written if k in fields and not dataclasses.is_dataclass(getattr(seen[0], k))]
    assert {k: getattr(seen[0], k) for k in same} == {k: written[k] for k in same}


def test_flags_and_files_override_the_replication_preset_which_fills_the_rest(tmp_path):
    from studies.replication.config import PAPER_SEEDS, DataRecipe, ReplicateConfig

    seen = []
    run = lambda argv: run_program(ReplicateConfig, seen.append, "python -m studies.replication", argv)  # noqa: E731
    run(["--preset", "full", "--train-top-layers", "4", "--bon-questions", "7"])
    cfg = seen[-1]
    assert (cfg.top_layers, cfg.bon_questions, cfg.seeds, cfg.prmbench_rows, cfg.out) == (
        4,
        7,
        PAPER_SEEDS,
        400,
        "studies/replication/results/full",
    )
    (tmp_path / "study.yaml").write_text(
        "preset: quick\nseeds: {l2r: 2, bi: 2}\ndata: {gsm8k_questions: 40, valid_fraction: 0.1}\n"
    )
    run(["--config", str(tmp_path / "study.yaml"), "--processbench-subsets", "[gsm8k]"])
    cfg = seen[-1]
    assert (cfg.seeds, cfg.data, cfg.processbench_subsets) == (
        {"l2r": 2, "bi": 2},
        DataRecipe(gsm8k_questions=40, valid_fraction=0.1),
        ("gsm8k",),
    )
    assert (cfg.processbench_rows, cfg.save_every) == (30, 20)  # the quick preset's
    (tmp_path / "bad.yaml").write_text("data: {gsm8k_questions: 40, colour: red}\n")
    with pytest.raises(SystemExit):
        run(["--config", str(tmp_path / "bad.yaml")])


def test_a_study_is_a_program_with_help_and_one_line_errors(tmp_path):
    help_text = subprocess.run(
        [sys.executable, "-m", "studies.mechanism", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert (
        help_text.returncode == 0
        and "--margins" in help_text.stdout
        and "version 3: each prediction's margin" in help_text.stdout
    )
    (tmp_path / "v3.yaml").write_text("version: 3\n")
    bad = subprocess.run(
        [sys.executable, "-m", "studies.mechanism", "--config", str(tmp_path / "v3.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "python -m studies.mechanism: error: version 3 reads its whole design" in bad.stderr


def test_an_interrupted_replication_says_what_it_keeps(tmp_path, monkeypatch, capsys):
    """Ctrl-C during the trunk caches or the runs: one line with the runs finished and where the caches are."""
    import studies.replication.recipe
    from studies.replication.__main__ import main

    def interrupted(cfg):
        (tmp_path / "out" / "runs").mkdir(parents=True)
        (tmp_path / "out" / "runs" / "l2r-seed1106.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(studies.replication.recipe, "replicate", interrupted)
    argv = ["--config", str(ROOT / "studies/replication/quick.yaml"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as stop:
        run_program(settings_of("replication"), main, "python -m studies.replication", [*argv, "--work-dir", "w"])
    assert stop.value.code == 130
    assert capsys.readouterr().err == (
        f"python -m studies.replication: interrupted; 1 of 4 runs are finished in {tmp_path / 'out'}/runs, and the "
        "trunk caches built so far are in w/trunk: the same command goes on from there\n"
    )
