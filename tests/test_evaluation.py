import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from biprm.cli import main
from biprm.data.readers import EMPTY_RESPONSE
from biprm.evaluation.ablations import ablation_table, format_ablation_table
from biprm.evaluation.cache import ScoreCache, ScoringStopped
import biprm.data.benchmarks as benchmarks
from biprm.data.synthetic import make_dataset
from biprm.data.template import STEP_TAG
from biprm.config import ScorerSettings
from biprm.data.segment import Segmenter
from biprm.data.trajectory import DataError, Trajectory
from biprm.data.benchmarks import balanced_slice, gsm8k_bon_small, spread
from biprm.evaluation.pools import load_pool
from biprm.evaluation.models import ScoreSource, ablation_sources, checkpoint_sources, score_sources
from biprm.scoring.step_scores import StepScores
from biprm.scoring import Scorer
from biprm.training import TrainConfig, train

FAST = ["--tokens-per-row", "0", "--tokens-per-batch", "4096"]  # one row per question: quickest on a CPU


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("bi")
    return train(
        TrainConfig(
            backbone="tiny",
            data="synthetic:64",
            max_steps=3,
            output_dir=str(out),
            save_steps=10**9,
            show_progress=False,
        )
    )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    """Shared by the command tests, so each real slice is scored once in this file."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def score_calls(monkeypatch) -> list[int]:
    """Sizes of the datasets that reach Scorer.score."""
    calls, real = [], Scorer.score
    monkeypatch.setattr(
        Scorer,
        "score",
        lambda self, trajs, progress=True: calls.append(len(trajs)) or real(self, trajs, progress=False),
    )
    return calls


def test_cache_scores_each_dataset_once(ckpt, tmp_path, score_calls):
    trajs = make_dataset(6, seed=3)
    first = ScoreCache(tmp_path).scores(ckpt, trajs)
    again = ScoreCache(tmp_path).scores(ckpt, trajs)  # a fresh cache object reads the file
    assert score_calls == [6]
    for stream in ("fused", "l2r", "r2l", "sigma"):
        np.testing.assert_array_equal(getattr(again, stream), getattr(first, stream))

    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)  # keys are content, not paths
    cache = ScoreCache(tmp_path)
    assert cache.model_key(str(copy)) == cache.model_key(ckpt)
    three = score_sources(checkpoint_sources(str(copy)), cache, trajs)
    assert score_calls == [6]
    assert list(three) == ["bi (fused)", "bi: L2R stream", "bi: R2L stream"]
    np.testing.assert_array_equal(three["bi: R2L stream"].fused, first.r2l)

    trajs[0].steps[0] += " (edited)"
    cache.scores(ckpt, trajs)
    assert score_calls == [6, 6]
    assert len(json.loads((tmp_path / "file_hashes.json").read_text())) == 2  # one weights file, two paths


def test_cache_keeps_overlength_policies_and_segmenters_apart(ckpt, tmp_path, score_calls):
    """Scores under two overlength policies, or of two cuts of one trace, never share an entry; the same cut by another
    name does."""
    text = "Wait, 3 + 4 = 7.\nSo the answer is 7.\n\nLet me check: 7 - 4 = 3."
    cuts = [
        Trajectory("q", Segmenter(name).cut(text, "row 1").texts) for name in ("paragraph", "lines", "double-newline")
    ]
    assert [len(t.steps) for t in cuts] == [2, 3, 2]
    for policy in ("head", "tail", "head"):
        cache = ScoreCache(tmp_path, ScorerSettings(overlength=policy))
        for t in cuts:
            cache.scores(ckpt, [t])
    assert score_calls == [
        1,
        1,
        1,
        1,
    ]  # head: paragraph, lines (double-newline is paragraph's cut); tail: the same two again


def test_an_interrupted_scoring_keeps_its_chunks_and_the_same_call_scores_only_the_rest(ckpt, tmp_path, monkeypatch):
    """Ctrl-C after two chunks of three keeps six of ten trajectories' scores; the rerun scores only the other four
    (one chunk of three, one of one), and its scores are those of an uninterrupted run."""
    trajs, calls, real = make_dataset(10, seed=5), [], Scorer.score

    def cache(name: str) -> ScoreCache:
        made = ScoreCache(tmp_path / name)
        made.chunk = 3
        return made

    whole = cache("whole").scores(ckpt, trajs)

    def score(self, encs, progress=True):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(len(encs))
        return real(self, encs, progress=False)

    monkeypatch.setattr(Scorer, "score", score)
    stop_after = 2
    with pytest.raises(ScoringStopped) as stop:
        cache("cut").scores(ckpt, trajs)
    parts = next((tmp_path / "cut").rglob("*.parts"))
    assert str(stop.value) == (
        f"scoring {ckpt}: 6 of 10 trajectories are kept in {parts} (and every score finished before, in "
        f"{tmp_path / 'cut'}); the same command scores only the other 4"
    )
    calls.clear()
    stop_after = None
    resumed = cache("cut").scores(ckpt, trajs)
    assert calls == [3, 1] and not parts.exists()
    for stream in ("offsets", "fused", "l2r", "r2l", "sigma"):
        np.testing.assert_array_equal(getattr(resumed, stream), getattr(whole, stream))
    assert cache("cut").scores(ckpt, trajs).fused.tolist() == whole.fused.tolist() and calls == [3, 1]


def test_ctrl_c_in_eval_names_what_the_scoring_kept(ckpt, tmp_path, monkeypatch, capsys):
    def interrupted(cfg):
        raise ScoringStopped("scoring m: 6 of 10 trajectories are kept in p")

    monkeypatch.setattr("biprm.evaluation.bon.run_bon", interrupted)
    with pytest.raises(SystemExit) as stop:
        main(["eval", "bon", "--model", ckpt, "--out", str(tmp_path / "out")])
    assert stop.value.code == 130
    assert capsys.readouterr().err.endswith("interrupted; scoring m: 6 of 10 trajectories are kept in p\n")


def test_ensemble_mode_averages_probabilities():
    class Stub:
        def scores(self, ckpt, trajs):
            p = {"a": [0.2, 0.4, 0.9], "b": [0.6, 0.8, 0.1]}[ckpt]
            return StepScores.from_probs(np.array([0, 2, 3]), np.array(p), l2r=np.array(p))

    mean = ScoreSource("2xl2r", ["a", "b"]).scores(Stub(), [])
    np.testing.assert_allclose(mean.prob(), [0.4, 0.6, 0.5])
    assert mean.sigma is None
    np.testing.assert_allclose(ScoreSource("x", ["a"], "l2r").scores(Stub(), []).prob(), [0.2, 0.4, 0.9])


def test_ablation_roles_are_checked(ckpt, tmp_path, capsys):
    with pytest.raises(SystemExit):  # a swapped flag fails before any scoring, in one line
        main(
            [
                "eval",
                "ablations",
                "--l2r",
                ckpt,
                "--r2l",
                ckpt,
                "--bi-static",
                ckpt,
                "--bi",
                ckpt,
                "--out",
                str(tmp_path),
            ]
        )
    assert "'l2r' row needs 'l2r'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs --l2r"):
        ablation_sources({"bi": ckpt, "l2r-2": ckpt})
    assert [m.key for m in ablation_sources({"bi": ckpt})] == ["bi"]


def test_ablation_table_layout():
    roles = ["bi", "2xr2l", "l2r", "bi-static", "r2l", "2xl2r"]  # any order in, the paper's order out
    bon = [{"pool": "gsm8k_bon_small", "modes": {r: {"mean": {"bon": 10.0 + i}} for i, r in enumerate(roles)}}]
    fixed = {"subsets": {"gsm8k": {"f1": 30.0}, "math": {"f1": 20.0}}, "average_f1": 25.0}
    pb = {"subsets": ["gsm8k", "math"], "modes": {r: {"fixed": fixed, "tuned": {"average_f1": 26.0}} for r in roles}}
    table = ablation_table(bon, pb)
    assert list(table["rows"]) == ["w/o R2L", "w/o L2R", "w/o Dynamic", "2×L2R", "2×R2L", "BiPRM"]
    assert table["columns"] == ["gsm8k_bon_small BoN", "GSM8K", "MATH", "PB Avg. F1", "PB Avg. F1 (tuned)"]
    lines = format_ablation_table(table).splitlines()
    assert lines[0] == "| method | gsm8k_bon_small BoN | GSM8K | MATH | PB Avg. F1 | PB Avg. F1 (tuned) |"
    assert lines[-1] == "| BiPRM | 10.0 | 30.0 | 20.0 | 25.0 | 26.0 |"

    partial = ablation_table(bon, None)  # no 2x rows given, no ProcessBench: those rows and columns are absent
    assert partial["columns"] == ["gsm8k_bon_small BoN"]


def test_balanced_slice_keeps_both_kinds_in_file_order():
    clean = np.array([False] * 6 + [False, True, False, True])  # wrong rows first, as in ProcessBench
    assert balanced_slice(clean, 2).tolist() == [0, 7]
    assert balanced_slice(clean, 5).tolist() == [0, 2, 4, 6, 7]  # 20% clean, as in the subset
    assert balanced_slice(clean, None).tolist() == list(range(10))
    assert spread(400, 4).tolist() == [0, 100, 200, 300]


def test_pqm_pool_is_graded_against_its_questions(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"question": "What is 2 + 3?", "answer": "5"},
                {"problem": "What is half of $\\frac{1}{2}$?", "answer": "\\frac{1}{4}"},
            ]
        )
    )
    responses = [
        ["Step 1: 2 + 3 = 5.\nStep 2: The answer is 5", "Step 1: 2 + 3 = 6.\nThe answer is: 6", "So it is \\boxed{5}."],
        ["Half of it is \\boxed{\\dfrac{1}{4}}", "It is \\boxed{0.25}", "No idea."],
    ]
    rows = [
        {"question": q, "responses": [{"text": t} for t in r]}
        for q, r in zip(["What is 2 + 3?", "What is half of $\\frac{1}{2}$?"], responses)
    ]
    pool_file = tmp_path / "pool.json"
    pool_file.write_text(json.dumps(rows))
    pool = load_pool(f"{pool_file}@{questions}", str(tmp_path), grade_workers=0)
    assert pool.name == "pool" and pool.qid.tolist() == [0, 0, 0, 1, 1, 1]
    assert pool.correct.tolist() == [True, False, True, True, True, False]
    assert pool.answer_key[:2].tolist() == ["5", "6"] and pool.answer_key[3] == "\\frac{1}{4}"
    assert pool.answer_key[5].startswith("<no answer")  # votes alone

    rows[1]["question"] = "Another question"
    pool_file.write_text(json.dumps(rows))
    with pytest.raises(DataError, match="row 2: question differs"):
        load_pool(f"{pool_file}@{questions}", str(tmp_path), grade_workers=0)
    with pytest.raises(DataError, match="no gold answer"):
        load_pool(str(pool_file), str(tmp_path), grade_workers=0)


def test_eval_bon_command(ckpt, data_dir, cache_dir, tmp_path, capsys):
    main(
        [
            "eval",
            "bon",
            "--model",
            ckpt,
            "--data-root",
            str(data_dir),
            "--limit",
            "2",
            "--ns",
            "2",
            "4",
            "8",
            "12",
            "16",
            "--draws",
            "4",
            "--aggs",
            "min",
            "last",
            "--out",
            str(tmp_path),
            "--cache-dir",
            cache_dir,
            *FAST,
        ]
    )
    result = json.loads((tmp_path / "bon.json").read_text())
    assert (result["pool"], result["questions"], result["candidates"]) == ("gsm8k_bon_small", 2, 24)
    assert result["ns"] == [2, 4, 8, 12] and result["skipped"] == [16]
    fused = result["modes"]["bi (fused)"]
    assert fused["mean"]["bon"] == pytest.approx(np.mean([fused["bon"][n] for n in ("2", "4", "8", "12")]))
    assert fused["pass"]["12"] >= fused["bon"]["12"]
    for protocol in ("first", "random"):
        p = result["protocols"][protocol]
        for name in (
            "bi (fused)",
            "random pick",
            "majority vote (fair ties)",
            "fewest steps",
            "most steps",
            "noise + min",
            "pass@n (oracle)",
        ):
            cell = p["rows"][name]["mean"]
            assert cell["low"] <= cell["mean"] <= cell["high"]
        assert "bi (fused) − bi: L2R stream" in p["differences"] and set(p["aggregations"]) == {"last"}
    # under the first-n protocol at n = 12 (the whole pool) both protocols see the same candidates
    assert (
        result["protocols"]["first"]["rows"]["random pick"]["12"]["mean"]
        == result["protocols"]["random"]["rows"]["random pick"]["12"]["mean"]
    )
    md = (tmp_path / "bon.md").read_text()
    assert (
        "| scorer | @2 | @4 | @8 | @12 | mean over n |" in md
        and "Protocol: random n-subsets" in md
        and "Paired differences" in md
    )
    assert "Protocol: first n candidates" in capsys.readouterr().out


def test_eval_processbench_command(ckpt, data_dir, cache_dir, tmp_path):
    main(
        [
            "eval",
            "processbench",
            "--model",
            ckpt,
            "--data-root",
            str(data_dir),
            "--limit",
            "2",
            "--tune-threshold",
            "--out",
            str(tmp_path),
            "--cache-dir",
            cache_dir,
            *FAST,
        ]
    )
    result = json.loads((tmp_path / "processbench.json").read_text())
    assert result["subsets"] == ["gsm8k", "math", "olympiadbench", "omnimath"]
    assert set(result["rows"].values()) == {2}
    fused = result["modes"]["bi (fused)"]
    assert set(fused["fixed"]["subsets"]) == set(result["subsets"])
    assert {s["n_error"] for s in fused["fixed"]["subsets"].values()} == {1}  # the slice keeps clean and wrong rows
    assert 0.0 <= fused["tuned"]["threshold"] <= 1.0
    # one clean and one wrong GSM8K row cannot be cross-fitted: GSM8K is not reported rather than reported in sample
    assert fused["tuned"]["folds"] == [] and fused["tuned"]["subsets"]["gsm8k"]["f1"] is None
    assert fused["tuned"]["subsets"]["math"]["f1"] is not None and "in_sample" in fused
    md = (tmp_path / "processbench.md").read_text()
    assert "with 95 % intervals from 1000 resamples" in md and len(fused["fixed"]["average_f1_interval"]) == 2
    assert (
        "tuned on GSM8K, for the other subsets; GSM8K too small to cross-fit" in md
        and "in sample: an upper bound" in md
        and "flag step k" in md
    )
    assert result["baselines"]["always -1 (no error)"]["subsets"]["gsm8k"]["acc_correct"] == 100.0
    assert "baseline: always step 0" in (tmp_path / "processbench.md").read_text()


def processbench_on(ckpt: str, data: Path, out: Path, cache_dir: str, *flags: str) -> dict:
    """`biprm eval processbench` on a file of ProcessBench rows; its processbench.json."""
    main(
        [
            "eval",
            "processbench",
            "--model",
            ckpt,
            "--data",
            str(data),
            "--out",
            str(out),
            "--cache-dir",
            cache_dir,
            *flags,
            *FAST,
        ]
    )
    return json.loads((out / "processbench.json").read_text())


def test_eval_processbench_on_the_users_own_file(ckpt, data_dir, cache_dir, tmp_path):
    rows = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())[:4]
    mine = tmp_path / "my_bench.json"
    mine.write_text(json.dumps(rows))
    result = processbench_on(ckpt, mine, tmp_path / "o", cache_dir)
    assert result["subsets"] == ["my_bench"] and result["rows"] == {"my_bench": 4}
    # the same file as a dev set: the threshold comes from it, and the report says so
    dev = tmp_path / "dev.json"
    every = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())
    dev.write_text(
        json.dumps([r for r in every if r["label"] == -1][:3] + [r for r in every if 0 <= r["label"] <= 1][:3])
    )
    result = processbench_on(ckpt, mine, tmp_path / "d", cache_dir, "--tune-data", str(dev))
    assert (
        result["modes"]["bi (fused)"]["tuned"]["tuned_on"] == "dev"
        and "tuned on a dev set" in (tmp_path / "d" / "processbench.md").read_text()
    )


def test_eval_processbench_recut_by_paragraphs_reads_back_the_given_steps(ckpt, data_dir, cache_dir, tmp_path):
    """--segmenter re-cuts each row's given steps, joined by a blank line, and maps the scores back: cut by paragraphs
    the pieces are the given steps, so every number equals the given-step run's; cut by markers the report says how
    the steps were cut and still counts the given rows."""
    rows = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())[:6]
    assert not any("\n\n" in step for r in rows for step in r["steps"])
    mine = tmp_path / "my_bench.json"
    mine.write_text(json.dumps(rows))
    results = {
        segmenter: processbench_on(ckpt, mine, tmp_path / segmenter, cache_dir, "--segmenter", segmenter)
        for segmenter in ("given", "paragraph", "markers")
    }
    assert results["paragraph"]["segmenter"] == "paragraph" and results["given"]["segmenter"] == "given"
    assert results["paragraph"]["modes"] == results["given"]["modes"]
    assert results["markers"]["rows"] == {"my_bench": 6}
    assert "cut again by `markers`" in (tmp_path / "markers" / "processbench.md").read_text()


def test_eval_all_writes_report_and_reruns_from_cache(ckpt, data_dir, cache_dir, tmp_path, score_calls):
    argv = [
        "eval",
        "all",
        "--model",
        ckpt,
        "--data-root",
        str(data_dir),
        "--limit",
        "2",
        "--cases",
        "2",
        "--out",
        str(tmp_path),
        "--cache-dir",
        cache_dir,
        *FAST,
    ]
    main(argv)
    for name in ("report.md", "results.json", "mae_by_position.png", "sigma_by_position.png", "cases.md", "cases.html"):
        assert (tmp_path / name).stat().st_size > 0, name
    results = json.loads((tmp_path / "results.json").read_text())
    assert {
        "bon",
        "processbench",
        "mae_by_position",
        "sigma_by_position",
        "long_chain_processbench",
        "perturbation",
        "cases",
    } <= set(results)
    assert set(results["bon"]["gsm8k_bon_small"]["aggregation"]["modes"]) == {
        "bi (fused)",
        "bi: L2R stream",
        "bi: R2L stream",
    }
    assert list(results["sigma_by_position"]) == ["bi (fused)"]
    report = (tmp_path / "report.md").read_text()
    sections = (
        "## Best-of-N: gsm8k_bon_small",
        "### Aggregation sensitivity",
        "## ProcessBench",
        "![MAE by position](mae_by_position.png)",
        "## Gate σ by position",
        "## Long chains: ProcessBench",
        "## Robustness to step-boundary perturbations",
        "[cases.html](cases.html)",
    )
    for section in sections:
        assert section in report, section
    scored = len(score_calls)
    main(argv)  # a rerun finds every score in the cache
    assert len(score_calls) == scored


def test_a_missing_data_folder_says_how_to_point_at_the_data(tmp_path):
    from biprm.data.benchmarks import load_processbench

    with pytest.raises(FileNotFoundError, match="pass --data-root DIR or set BIPRM_DATA=DIR"):
        load_processbench(str(tmp_path / "nowhere"), ("gsm8k",))


def test_a_damaged_cache_file_is_named_removed_and_rebuilt_and_timeouts_are_retried(tmp_path, caplog):
    import logging

    import numpy as np

    from biprm.data.trajectory import Trajectory
    from biprm.evaluation.cache import ScoreCache

    cache, trajs, calls = ScoreCache(tmp_path), [Trajectory("q", ["a"])], []

    def compute():
        calls.append(1)
        return np.array([-1, 1] if len(calls) == 1 else [0, 1], dtype=np.int8)  # the first run has a timeout

    timed_out = lambda v: bool((v == -1).any())  # noqa: E731
    assert cache.array("grades", None, trajs, "x", compute, retry=timed_out).tolist() == [-1, 1]
    assert cache.array("grades", None, trajs, "x", compute, retry=timed_out).tolist() == [0, 1] and len(calls) == 2
    assert cache.array("grades", None, trajs, "x", compute, retry=timed_out).tolist() == [0, 1] and len(calls) == 2
    path = next(tmp_path.rglob("grades-*.npz"))
    path.write_bytes(b"PK\x03\x04 torn")
    with caplog.at_level(logging.WARNING):
        assert cache.array("grades", None, trajs, "x", compute, retry=timed_out).tolist() == [0, 1]
    assert len(calls) == 3 and f"cache file {path} is damaged" in caplog.text


def _launch(*argv: str, processes: int = 2) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "-m",
        "biprm.cli",
        "-v",
        *argv,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # launches torchrun twice
def test_eval_on_two_processes_equals_one_and_names_a_failing_process(ckpt, data_dir, tmp_path):
    args = [
        "eval",
        "bon",
        "--model",
        ckpt,
        "--data-root",
        str(data_dir),
        "--limit",
        "3",
        "--ns",
        "4",
        "8",
        "--grade-workers",
        "0",
        *FAST,
    ]
    main([*args, "--out", str(tmp_path / "one")])
    done = _launch(*args, "--out", str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scoring 36 trajectories" in done.stderr and "on 2 processes (18/18 rows each)" in done.stderr
    one, two = (json.loads((tmp_path / d / "bon.json").read_text()) for d in ("one", "two"))
    assert two == one
    (a,), (b,) = (
        list((tmp_path / d / "cache").glob("*/scores-*.npz")) for d in ("one", "two")
    )  # only the first process writes
    with np.load(a) as x, np.load(b) as y:
        assert x.files == y.files
        for k in x.files:
            np.testing.assert_allclose(y[k], x[k], rtol=0, atol=1e-6)

    rows = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())[:4]
    rows[3]["steps"][0] += " " + STEP_TAG  # a row the model cannot read, in the second process's block
    (tmp_path / "bad.json").write_text(json.dumps(rows))
    done = _launch(
        "eval",
        "processbench",
        "--model",
        ckpt,
        "--data",
        str(tmp_path / "bad.json"),
        "--out",
        str(tmp_path / "bad"),
        *FAST,
    )
    assert "failed on process 2 of 2, which scored rows 3-4" in done.stderr and "the step tag" in done.stderr
    assert done.returncode != 0 and not (tmp_path / "bad" / "processbench.json").exists()


def test_eval_names_a_folder_that_is_not_a_checkpoint_in_one_line(tmp_path, capsys):
    from biprm.backbones import resolve_backbone

    with pytest.raises(SystemExit) as stop:
        main(["eval", "bon", "--model", resolve_backbone("tiny"), "--limit", "2", "--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plain" in err and "KeyError" not in err


def test_ablations_warn_when_objectives_differ(tmp_path):
    from biprm.evaluation.ablations import unlike_objectives

    folders = {}
    for role, objective in (("l2r", "bce"), ("bi", "qrank")):
        folder = tmp_path / role
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "biprm", "mode": role, "objective": objective}))
        (folder / "model.safetensors").write_bytes(b"")
        folders[role] = str(folder)
    assert "l2r: bce, bi: qrank" in unlike_objectives(folders)
    assert unlike_objectives({"l2r": folders["l2r"]}) is None


@pytest.fixture(scope="module")
def bon_small(data_dir):
    return gsm8k_bon_small(str(data_dir))


def test_real_gsm8k_bon_small(bon_small):
    assert len(bon_small) == 1319 * 12
    assert [t.meta["cand"] for t in bon_small[:12]] == list(range(12)) and {t.meta["qid"] for t in bon_small[-12:]} == {
        1318
    }
    correct = Counter(t.meta["policy"] for t in bon_small if t.correct)
    assert correct["abel_7b"] == 784 and correct["gpt4"] == 1230 and correct["175b_verification"] == 742
    first = bon_small[:12]
    assert {t.answer for t in first} == {"18"} and len({t.question for t in first}) == 1
    assert not any(re.search(r"<<[^<>]*>>", s) for t in bon_small for s in t.steps)
    assert first[3].steps[-1] == "The answer is 18." and first[4].steps[-1] == "The answer is 18."
    assert sum(t.steps == [EMPTY_RESPONSE] for t in bon_small) == 1


def test_gsm8k_bon_small_checks_alignment(data_dir, monkeypatch):
    real = benchmarks.read_rows

    def shuffled(source, split="train"):
        rows, name = real(source, split)
        return (rows[::-1], name) if "abel_13b" in source else (rows, name)

    monkeypatch.setattr(benchmarks, "read_rows", shuffled)
    with pytest.raises(DataError, match=r"abel_13b\.json\.gz row 1: field 'question' does not match question 1"):
        gsm8k_bon_small(str(data_dir))


def test_the_grader_overrules_stored_flags_where_the_gold_is_known(tmp_path, caplog):
    # gsm8k_bon_small's MetaMath flags were set on answers rounded to integers, and its GSM-Plus flags against
    # golds stored as 'None' (questions 144 and 364 of GSM8K test); a question without a gold keeps its flags.
    rows = [
        {
            "question": "Q1",
            "answer": "16",
            "candidates": [
                {"text": "The total is $15 + $1.50 = $16.50.\nThe answer is 16.5.", "correct": True},
                {"text": "It costs 16 dollars.\n#### 16", "correct": False},
            ],
        },
        {
            "question": "Q2",
            "candidates": [
                {"text": "The answer is 3.", "correct": True},
                {"text": "The answer is 4.", "correct": False},
            ],
        },
    ]
    pool_file = tmp_path / "pool.json"
    pool_file.write_text(json.dumps(rows))
    with caplog.at_level(logging.WARNING):
        pool = load_pool(str(pool_file), str(tmp_path), grade_workers=0)
    assert pool.correct.tolist() == [False, True, True, False]
    assert "overrules 2 stored correctness flags" in caplog.text


def test_a_file_without_gsm8k_rows_gets_a_cross_fitted_threshold_and_flag_step_row():
    from biprm.data.trajectory import Trajectory, labels_from_first_error
    from biprm.evaluation.processbench import evaluate_processbench, format_processbench, question_halves
    from biprm.scoring.step_scores import StepScores

    # A clean, B wrong at step 1, C clean, D wrong at step 0; every
    # probability is above 0.5, so the fixed 0.5 finds nothing.
    first = {"A": -1, "B": 1, "C": -1, "D": 0}
    trajs = [
        Trajectory(f"question {q}", ["s1", "s2"], labels=labels_from_first_error(e, 2), meta={"subset": "mine"})
        for q, e in first.items()
    ]
    probs = [[0.95, 0.9], [0.95, 0.7], [0.95, 0.85], [0.6, 0.95]]
    scores = StepScores.from_probs(np.arange(0, 9, 2), np.array(probs).ravel())
    result = evaluate_processbench(trajs, {"m": scores})
    tuned = result["modes"]["m"]["tuned"]
    # folds: {A, B} and {C, D}. Tuned on A, B: F1 100 for any threshold in (0.7, 0.9]; the grid (midpoints of
    # 0, 0.7, 0.9, 0.95, 1) offers 0.8. On C, D: (0.6, 0.85] offers 0.725. Each predicts the other fold exactly.
    assert tuned["tuned_on"] == "these rows" and [f["threshold"] for f in tuned["folds"]] == pytest.approx([0.8, 0.725])
    assert tuned["subsets"]["mine"]["f1"] == 100.0 and result["modes"]["m"]["fixed"]["subsets"]["mine"]["f1"] == 0.0
    # flag step k: on either fold every k has F1 0 (two steps, one clean row and one wrong one), so k = 0 everywhere;
    # on all rows it finds D only and passes no clean row: F1 0.
    rule = result["baselines"][
        "flag step k when there are more than k steps (k = 0 and 0: cross-fitted, each half of these rows (by "
        "question) at the value tuned on the other)"
    ]
    assert (
        rule["folds"] == [0, 0]
        and rule["subsets"]["mine"]["acc_error"] == 50.0
        and rule["subsets"]["mine"]["f1"] == 0.0
    )
    markdown = format_processbench(result)
    # the row names the thresholds its halves were predicted with, not the one tuned on all rows (never used)
    assert "m @ threshold = 0.800 and 0.725: cross-fitted, each half of these rows (by question)" in markdown
    row = next(line for line in markdown.splitlines() if "m @ threshold" in line)
    assert f"{tuned['threshold']:.3f}" not in row
    # rows written alike once case and spacing are normalised are one question, in one fold
    again = trajs + [Trajectory("Question  a", ["s1", "s2"], labels=[1.0, 1.0], meta={"subset": "mine"})]
    assert [h.tolist() for h in question_halves(again, np.arange(5), np.array([-1, 1, -1, 0, -1]))] == [
        [0, 1, 4],
        [2, 3],
    ]
    # rows of one question share a fold, whatever their order
    twice = trajs + [Trajectory("question A", ["s1", "s2"], labels=[1.0, 1.0], meta={"subset": "mine"})]
    halves = question_halves(twice, np.arange(5), np.array([-1, 1, -1, 0, -1]))
    assert [h.tolist() for h in halves] == [[0, 1, 4], [2, 3]]


def test_two_models_and_two_files_of_one_name_keep_their_own_rows(ckpt, data_dir, cache_dir, tmp_path, capsys):
    """Folders a/bi and b/bi, files x/bench.json and y/bench.json: labels grow to a tail that tells them apart; the JSON
    names each resolved path. The same folder or file given twice is refused in one line."""
    models = [tmp_path / side / "bi" for side in ("a", "b")]
    for folder in models:
        shutil.copytree(ckpt, folder)
    every = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())
    clean, wrong = [r for r in every if r["label"] == -1], [r for r in every if r["label"] >= 0]
    files = [tmp_path / side / "bench.json" for side in ("x", "y")]
    for i, file in enumerate(files):
        file.parent.mkdir()
        file.write_text(json.dumps(clean[2 * i : 2 * i + 2] + wrong[3 * i : 3 * i + 3]))
    argv = ["eval", "processbench", "--model", *map(str, models), "--data", *map(str, files)]
    main([*argv, "--out", str(tmp_path / "o"), "--cache-dir", cache_dir, *FAST])
    result = json.loads((tmp_path / "o" / "processbench.json").read_text())
    assert result["subsets"] == ["x/bench", "y/bench"] and result["rows"] == {"x/bench": 5, "y/bench": 5}
    assert {"a/bi: bi (fused)", "b/bi: bi (fused)"} <= set(result["modes"])
    assert result["models"] == [
        {"label": "a/bi", "path": str(models[0].resolve()), "kind": "bi"},
        {"label": "b/bi", "path": str(models[1].resolve()), "kind": "bi"},
    ]
    assert result["files"] == {"x/bench": str(files[0].resolve()), "y/bench": str(files[1].resolve())}
    assert f"`a/bi`: bi at {models[0].resolve()}" in (tmp_path / "o" / "processbench.md").read_text()
    for twice in (
        ["--model", str(models[0]), f"{models[0]}/.", "--data", str(files[0])],
        ["--model", str(models[0]), "--data", str(files[0]), str(tmp_path / "x" / ".." / "x" / "bench.json")],
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(["eval", "processbench", *twice, "--out", str(tmp_path / "r"), "--cache-dir", cache_dir, *FAST])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1 and "give it once" in err


def test_best_of_n_header_counts_distinct_questions_and_draws_them_whole():
    from biprm.evaluation.bon import evaluate_bon, format_bon
    from biprm.evaluation.pools import Pool

    texts = ["How many eggs?", "how many  eggs?", "How many hens?", "How many ducks?"]  # pools 0 and 1: one question
    trajs = [Trajectory(q, ["a", "b"][: 1 + i % 2]) for q in texts for i in range(4)]
    pool = Pool("mine", trajs, np.repeat(np.arange(4), 4), np.tile([True, False, False, True], 4), np.arange(16))
    result = evaluate_bon(pool, {}, ns=(2,), protocols=("first",))
    assert (result["questions"], result["distinct_questions"]) == (4, 3)
    assert "4 pools on 3 distinct questions" in format_bon(result) and "pools of one question drawn together" in (
        format_bon(result)
    )


def test_rows_cut_at_max_length_are_counted_in_the_written_ledger_fresh_and_from_the_cache(
    ckpt, data_dir, cache_dir, tmp_path, score_calls
):
    """Six rows on two questions: three of 2 steps (never cut) and three of 30 (cut at 200 tokens); one wrong row's
    first error, at step 28, lies in its dropped part."""
    base = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())[0]
    step = "Then we add the two numbers again and check the sum once more, step by step."
    rows = [
        base | {"problem": f"What is {q} plus {q}?", "steps": [step] * n, "label": label}
        for q, n, label in [(1, 2, -1), (1, 2, 1), (2, 2, -1), (1, 30, -1), (2, 30, 28), (2, 30, 0)]
    ]
    mine = tmp_path / "cut.json"
    mine.write_text(json.dumps(rows))
    n_steps = np.array([len(r["steps"]) for r in rows])
    books = []
    for run in ("fresh", "cached"):
        result = processbench_on(ckpt, mine, tmp_path / run, str(tmp_path / "cache"), "--max-length", "200")
        books.append(result["ledger"])
        md = (tmp_path / run / "processbench.md").read_text()
        counts = books[-1]["cut"]["models"]["bi (fused)"]
        row = f"| cut | 6 | 6 | 2 | bi (fused) | 0 | 3 | {counts['steps_dropped']} | 1 |"
        assert counts["rows_cut"] == 3 and counts["first_errors_dropped"] == 1 and row in md
    assert len(score_calls) == 1 and books[0] == books[1]  # the second run read the cache, and says the same
    assert 3 <= books[0]["cut"]["models"]["bi (fused)"]["steps_dropped"] < n_steps.sum() - 6


def test_a_row_past_max_length_from_its_first_step_is_left_out_and_counted_not_the_end_of_the_run(
    ckpt, data_dir, tmp_path, capsys
):
    """Five rows; one question alone is longer than --max-length 200: the tables stand on the four others and the
    ledger counts it, fresh and from the cache; --on-overlength refuse stops on it in one line naming it."""
    base = json.loads((data_dir / "processbench" / "gsm8k.json").read_text())[0]
    long = "What is the sum of " + " plus ".join(map(str, range(200))) + "?"
    rows = [
        base | {"id": f"r{i}", "problem": q, "steps": ["Add them.", "The sum is 3."], "label": label}
        for i, (q, label) in enumerate(
            [("What is 1 plus 2?", -1), ("What is 2 plus 1?", 0), (long, -1), ("What is 0 plus 3?", -1), ("1+2?", 1)]
        )
    ]
    mine = tmp_path / "long.json"
    mine.write_text(json.dumps(rows))
    for run in ("fresh", "cached"):
        result = processbench_on(ckpt, mine, tmp_path / run, str(tmp_path / "cache"), "--max-length", "200")
        book = result["ledger"]["long"]
        assert (book["rows"], book["in_tables"], result["rows"]) == (5, 4, {"long": 4})
        assert book["models"]["bi (fused)"]["rows_not_scorable"] == 1
        assert "| long | 5 | 4 | 5 | bi (fused) | 1 | 0 | 0 | 0 |" in (tmp_path / run / "processbench.md").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        processbench_on(
            ckpt, mine, tmp_path / "r", str(tmp_path / "cache"), "--max-length", "200", "--on-overlength", "refuse"
        )
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1
    assert "long row r2: field 'steps': question and first step need more than --max-length=200" in err


def test_a_pool_smaller_than_the_smallest_n_and_a_candidate_no_model_scored_are_counted_in_the_ledger():
    """Pools of 4, 4 and 1 candidates at n = 2, and one candidate of the first pool with no scored step: the third
    pool is left out and said so, the unscored candidate leaves the tables; before, the 1-candidate pool ended the
    run ("no n fits the smallest pool")."""
    from biprm.evaluation.bon import evaluate_bon, format_bon
    from biprm.evaluation.pools import Pool

    texts = ["How many eggs?", "How many hens?", "How many ducks?"]
    trajs = [Trajectory(q, ["a", "b"]) for q, size in zip(texts, (4, 4, 1)) for _ in range(size)]
    qid = np.repeat(np.arange(3), (4, 4, 1))
    pool = Pool("mine", trajs, qid, np.arange(9) % 2 == 0, np.arange(9).astype(str))
    lengths = np.array([0, 2, 2, 2, 2, 2, 2, 2, 2])  # candidate 0: no step scored
    scores = StepScores.from_probs(np.concatenate([[0], np.cumsum(lengths)]), np.linspace(0.1, 0.9, lengths.sum()))
    result = evaluate_bon(pool, {"m": scores}, ns=(2,), protocols=("first",))
    book = result["ledger"]["mine"]
    assert (book["rows"], book["in_tables"], book["pools"], book["pools_too_small"]) == (9, 7, 3, 1)
    assert book["models"]["m"]["rows_not_scorable"] == 1 and (result["questions"], result["candidates"]) == (2, 7)
    assert "mine: 1 of 3 pools hold fewer than the smallest n asked (2)" in format_bon(result)


def test_a_file_whose_rows_all_lack_labels_is_refused_naming_the_field(tmp_path):
    """ProcessBench rows without 'label', and a pool whose candidates have neither a 'correct' flag nor a gold answer:
    both are refused in one message naming the file, row and field, before anything is scored."""
    rows = tmp_path / "bench.json"
    rows.write_text(json.dumps([{"id": f"r{i}", "problem": "What is 1 plus 2?", "steps": ["3."]} for i in range(3)]))
    with pytest.raises(DataError, match=rf"^{re.escape(str(rows))} row 1: field 'label' is missing$"):
        benchmarks.load_processbench(str(tmp_path), (str(rows),))
    pool = tmp_path / "pool.json"
    pool.write_text(
        json.dumps([{"question": "What is 1 plus 2?", "candidates": [{"steps": ["3."]}, {"steps": ["4."]}]}])
    )
    with pytest.raises(DataError, match="candidates have no stored 'correct' flag and no gold answer"):
        load_pool(str(pool), str(tmp_path), grade_workers=0)


def test_eval_all_stands_its_analyses_on_the_rows_every_model_scored(ckpt, data_dir, tmp_path):
    """At --max-length 390 the one OlympiadBench row of --limit 1 (a question and first step of 398 tokens before the
    template) cannot be scored at all: eval all still writes its report, the ledger counts it, and the analyses read
    the table's rows (before, they read the unscored row too)."""
    argv = ["eval", "all", "--model", ckpt, "--data-root", str(data_dir), "--limit", "1", "--cases", "2", "--subsets"]
    main([*argv, "math", "olympiadbench", "omnimath", "--max-length", "390", "--out", str(tmp_path), *FAST])
    results = json.loads((tmp_path / "results.json").read_text())
    book = results["processbench"]["ledger"]
    assert book["olympiadbench"]["rows"] - book["olympiadbench"]["in_tables"] == 1
    assert results["mae_by_position"]["n_trajectories"] == sum(g["in_tables"] for g in book.values()) == 2
