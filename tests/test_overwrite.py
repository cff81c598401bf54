"""No command writes over what it did not write in this run without --overwrite: an export into a folder holding
another model, a score onto an --output that exists (a --resume of the run let write there still goes on). Training's
own folder rules: test_run_folder.py."""

import logging
from pathlib import Path

import pytest

from biprm.cli import main


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """An untrained tiny bi model: what export and score read."""
    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone

    out = tmp_path_factory.mktemp("model")
    tokenizer = load_tokenizer(resolve_backbone("tiny"))
    from_backbone(resolve_backbone("tiny"), tokenizer, mode="bi").save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def test_an_export_into_a_folder_holding_a_model_is_refused_unless_overwrite(model, tmp_path, capsys, caplog):
    """Issue 56, finding 8: `biprm export --out <another run's folder>` replaced its model.safetensors and config.json,
    rc 0."""
    export = ["export", "--model", model, "--out", str(tmp_path / "e")]
    main(export)
    held = sorted(p.name for p in (tmp_path / "e").iterdir())
    with pytest.raises(SystemExit) as stop:
        main(export)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"--out {tmp_path / 'e'} holds {', '.join(held)}; choose another --out" in err, err
    with caplog.at_level(logging.WARNING):
        main([*export, "--overwrite"])
    assert f"--overwrite: deleting {', '.join(held)} in {tmp_path / 'e'}" in caplog.text
    (tmp_path / "e" / "notes.txt").touch()
    with pytest.raises(SystemExit):
        main([*export, "--overwrite"])
    assert "holds notes.txt, which no model folder holds" in capsys.readouterr().err
    assert (tmp_path / "e" / "notes.txt").is_file() and (tmp_path / "e" / "config.json").is_file()


def test_a_score_onto_an_existing_output_is_refused_unless_overwrite_and_its_resume_goes_on(
    model, tmp_path, capsys, monkeypatch
):
    """Issue 56, finding 8: `biprm score` replaced an existing output file without a word."""
    from biprm.scoring import Scorer

    out = tmp_path / "scores.jsonl"
    out.write_text("an older run's scores\n")
    score = ["score", "--model", model, "--input", "synthetic:5", "--output", str(out), "--chunk", "2"]
    monkeypatch.setattr(Scorer, "from_settings", lambda *a: pytest.fail("the model loaded before the refusal"))
    with pytest.raises(SystemExit) as stop:
        main(score)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"--output {out} exists; choose another --output, or --overwrite" in err, err
    monkeypatch.undo()
    real, calls = Scorer.score, []

    def dies_on_second_chunk(self, trajs, progress=True):
        calls.append(len(trajs))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, trajs, progress)

    monkeypatch.setattr(Scorer, "score", dies_on_second_chunk)
    with pytest.raises(SystemExit):
        main([*score, "--overwrite"])
    assert out.read_text() == "an older run's scores\n"  # replaced only once the new scores are complete
    monkeypatch.setattr(Scorer, "score", real)
    main([*score, "--resume"])  # the run that --overwrite let write there goes on
    assert len(out.read_text().splitlines()) == 5 and not Path(f"{out}.parts").exists()


@pytest.mark.parametrize("rank, said", [("0", 1), ("1", 0)])
def test_ctrl_c_under_torchrun_is_one_line_from_the_first_process(monkeypatch, capsys, rank, said):
    """Issue 56, item 10: every process of a torchrun job printed its own interrupted line, so the saved step was
    named once per process."""
    import biprm.training

    def interrupted(cfg, callbacks=None):
        raise KeyboardInterrupt("runs/x/checkpoint-2 is saved: the same command with --resume goes on from its step 2")

    monkeypatch.setattr(biprm.training, "train", interrupted)
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--output-dir", "runs/x"])
    err = capsys.readouterr().err
    assert stop.value.code == 130 and err.count("biprm train: interrupted; runs/x/checkpoint-2 is saved") == said, err


def test_an_eval_out_holding_another_runs_results_is_refused_unless_overwrite_and_a_rerun_goes_on(
    model, tmp_path, monkeypatch, capsys, caplog
):
    """Issue 56, item 1: `biprm eval` replaced the results in --out whatever wrote them. The same command (its model
    spelt otherwise) reruns from its cache; another command's results stay beside; other settings are refused unless
    --overwrite, which deletes exactly this command's results; a file no eval writes is refused even then."""
    runs = []

    def recipe(stem: str):
        def run(cfg):
            runs.append((stem, cfg.limit))
            for suffix in (".json", ".md"):
                Path(cfg.out, stem + suffix).write_text(str(cfg.limit))

        return run

    monkeypatch.setattr("biprm.evaluation.bon.run_bon", recipe("bon"))
    monkeypatch.setattr("biprm.evaluation.processbench.run_processbench", recipe("processbench"))
    out = tmp_path / "eval"
    bon = ["eval", "bon", "--model", model, "--out", str(out), "--limit", "2"]
    main(bon)
    main(["eval", "bon", "--model", model + "/.", "--out", str(out), "--limit", "2"])
    main(["eval", "processbench", "--model", model, "--out", str(out)])
    bon[-1] = "3"
    with pytest.raises(SystemExit) as stop:
        main(bon)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and (
        f"--out {out} holds bon.json, bon.md, written by another biprm eval bon (limit: 2 then, 3 now); "
        "choose another --out, or --overwrite, which deletes them" in err
    ), err
    with caplog.at_level(logging.WARNING):
        main([*bon, "--overwrite"])
    assert f"--overwrite: deleting bon.json, bon.md in {out}" in caplog.text
    assert runs == [("bon", 2), ("bon", 2), ("processbench", None), ("bon", 3)]
    assert (out / "processbench.json").read_text() == "None" and (out / "bon.json").read_text() == "3"
    (out / "notes.txt").touch()
    with pytest.raises(SystemExit):
        main([*bon, "--overwrite"])
    assert "holds notes.txt, which biprm eval bon never writes" in capsys.readouterr().err
    assert (out / "notes.txt").is_file() and len(runs) == 4
