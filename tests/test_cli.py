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


def test_score_to_stdout_carries_every_input_field(checkpoint, tmp_path, capsys):
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "q7", "prompt": "What is 1 + 1?", "completions": ["1 + 1 = 2.", "The answer is 2."], "labels": [True, True], "source": "mine"}))
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", "-"])
    out = capsys.readouterr()
    line = json.loads(out.out)
    assert line["meta"] == {"id": "q7", "source": "mine"} and line["labels"] == [1.0, 1.0] and line["steps_scored"] == 2
    assert "wrote 1 scored trajectories to stdout" in out.err


def test_score_schema_is_the_same_for_every_mode(tmp_path):
    from biprm.scores import StepScores
    from biprm.trajectory import Trajectory
    from biprm.writers import write_scores

    trajs = [Trajectory("q", ["a", "b"])]
    l2r = StepScores(offsets=[0, 2], fused=[0.5, 0.25], l2r=[0.5, 0.25])
    bi = StepScores(offsets=[0, 2], fused=[0.5, 0.25], l2r=[0.5, 0.25], r2l=[0.5, 0.5], sigma=[1.0, 0.0])
    keys = []
    for name, s in (("l2r", l2r), ("bi", bi)):
        write_scores(str(tmp_path / f"{name}.jsonl"), trajs, s)
        keys.append(list(json.loads((tmp_path / f"{name}.jsonl").read_text())))
    assert keys[0] == keys[1] and not list(tmp_path.glob("*.partial"))
    assert json.loads((tmp_path / "l2r.jsonl").read_text())["sigma"] is None


def test_bad_input_is_one_line_before_the_model_loads(checkpoint, tmp_path, capsys, monkeypatch):
    from biprm.scoring import Scorer

    monkeypatch.setattr(Scorer, "from_pretrained", lambda *a, **k: pytest.fail("the model loaded before the input was checked"))
    rows = tmp_path / "bad.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "completions": ["a"]}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    with pytest.raises(SystemExit) as stop:
        main(["score", "--model", checkpoint, "--input", str(rows)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err
    assert err.startswith("biprm score: error: ") and "bad.jsonl" in err and "row 2" in err and "'completions'" in err
    with pytest.raises(SystemExit):
        main(["score", "--model", str(tmp_path / "nowhere"), "--input", str(rows)])
    assert "no checkpoint there" in capsys.readouterr().err
