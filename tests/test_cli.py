"""The command line as a user runs it: score writes JSONL, the demo writes its table, JSON and plot."""
import json

import pytest

from biprm.aggregate import AGGREGATIONS
from biprm.cli import main
from biprm.train import TrainConfig, train


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    return train(TrainConfig(backbone="tiny", data="synthetic:16", mode="bi", max_steps=1, batch_size=4,
                             grad_accum=1, output_dir=str(out), save_steps=10**9, show_progress=False))


def test_score_writes_per_step_and_solution_scores(checkpoint, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text("\n".join(json.dumps({"prompt": f"What is {k} + {k}?", "completions": [f"{k} + {k} = {2 * k}", f"The answer is {2 * k}."]}) for k in range(5)))
    out = tmp_path / "scores.jsonl"
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 5
    for line in lines:
        for stream in ("l2r", "r2l", "sigma", "fused"):
            assert len(line[stream]) == 2 and all(0 <= v <= 1 for v in line[stream])
        assert set(line["solution"]) == set(AGGREGATIONS)
        assert line["solution"]["min"] == pytest.approx(min(line["fused"]), abs=1e-6)


def test_demo_end_to_end_on_a_tiny_budget(tmp_path, capsys):
    main(["demo", "--output-dir", str(tmp_path), "--n-train", "48", "--n-test", "24", "--bon-questions", "4",
          "--bon-candidates", "8", "--epochs", "0.5", "--batch-size", "8"])
    table = capsys.readouterr().out
    for mode in ("l2r", "r2l", "bi-static", "bi"):
        assert f"\n{mode} " in table
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert set(results) == {"l2r", "r2l", "bi-static", "bi"}
    assert 0 <= results["bi"]["processbench"]["f1"] <= 100
    assert (tmp_path / "sigma_by_position.png").stat().st_size > 1000
