"""Every command and Python block of README.md, docs/ and studies/*/README.md names what exists: each biprm
sub-command and flag, each `python -m studies.X` and `python -m benchmarks` flag (read from the parsers themselves,
no process per flag), and each name a Python block uses."""

import subprocess
import sys

import pytest
from docblocks import PAGES, ROOT, commands, fenced, stale

PLANTED = """Some prose.

```bash
biprm train --data synthetic:10 --max-lenght 64   # a typo
biprm replicate --preset quick
biprm eval bon --model runs/bi --agg median
BIPRM_CACHE=/tmp python -m benchmarks --preset quick --shapes tiny && biprm score --model m --input i
```
"""


def test_every_documented_command_and_flag_exists():
    parsers: dict = {}
    found = [problem for page in PAGES for problem in stale(page.read_text(), page.relative_to(ROOT).name, parsers)]
    assert found == []
    assert {"biprm", "benchmarks", "studies.replication", "studies.mechanism"} <= set(parsers)


def test_the_check_reads_every_page_and_enough_commands():
    assert {p.relative_to(ROOT).as_posix() for p in PAGES} >= {
        "README.md",
        "docs/TRAINING.md",
        "studies/mechanism/README.md",
        "studies/replication/README.md",
    }
    found = [c for page in PAGES for b in fenced(page.read_text()) if b.lang == "bash" for c in commands(b.code)]
    assert len(found) > 60


def test_a_planted_stale_flag_or_command_fails_the_check():
    assert stale(PLANTED, "PLANTED.md", {}) == [
        "PLANTED.md: `biprm train`: no flag --max-lenght",
        "PLANTED.md: `biprm replicate --preset quick`: no such sub-command",
        "PLANTED.md: `biprm eval bon --model runs/bi --agg median` does not parse",
        "PLANTED.md: `benchmarks`: no flag --shapes",
    ]


def test_commands_are_split_at_shell_operators_and_comments():
    assert list(commands("A=1 biprm score --model $M --input x.jsonl | head  # biprm nope\n")) == [
        ("biprm", ["score", "--model", "1", "--input", "x.jsonl"])
    ]


def test_every_python_block_defines_the_names_it_uses(tmp_path):
    ruff = pytest.importorskip("ruff", reason="ruff comes with the [dev] extra")
    written = []
    for page in PAGES:
        for i, block in enumerate(b for b in fenced(page.read_text()) if b.lang == "python"):
            written.append(tmp_path / f"{page.parent.name}_{page.stem}_{i}.py")
            written[-1].write_text(block.code)
    assert len(written) >= 8
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F821", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout
    assert ruff


def test_the_readmes_evaluate_commands_give_a_quick_run_beside_the_full_one():
    block = next(b.code for b in fenced((ROOT / "README.md").read_text()) if "biprm eval all" in b.code)
    quick, full = [argv for _, argv in commands(block)]
    assert "--limit" in quick and "--limit" not in full
    assert "over an hour" in block
