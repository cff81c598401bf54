"""The replication recipe end to end at toy size (tiny backbone, a few rows of every real set)."""

import dataclasses
import json

import pytest

from studies.replication.config import DataRecipe, ReplicateConfig
from studies.replication.recipe import replicate, report_only, run_folder, runs_of


def test_runs_cover_every_mode_before_repeating_seeds():
    cfg = ReplicateConfig(seeds={"l2r": 3, "bi": 3, "r2l": 1, "bi-static": 1})
    assert runs_of(cfg)[:4] == [("l2r", 1106), ("bi", 1106), ("r2l", 1106), ("bi-static", 1106)]
    assert runs_of(cfg)[4:] == [("l2r", 1107), ("bi", 1107), ("l2r", 1108), ("bi", 1108)]
    cfg.seeds["bi-detached"] = 1
    assert runs_of(cfg)[-1] == ("bi-detached", 1106)  # the gate study comes after the main comparison


@pytest.mark.slow
def test_toy_replication_runs_resumes_and_reports(data_dir, tmp_path):
    cfg = ReplicateConfig(
        preset="toy",
        out=str(tmp_path / "out"),
        work_dir=str(tmp_path / "work"),
        data_root=str(data_dir),
        backbone="tiny",
        top_layers=1,
        seeds={"l2r": 1, "bi": 2},
        data=DataRecipe(prmbench_rows=12, gsm8k_questions=12, valid_fraction=0.25),
        processbench_rows=6,
        prmbench_rows=8,
        bon_questions=3,
        batch_size=4,
        save_every=2,
        bf16="no",
        max_length=2048,
    )
    results = replicate(cfg)
    out = tmp_path / "out"
    runs = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert runs == ["bi-seed1106.json", "bi-seed1107.json", "l2r-seed1106.json"]
    summary = results["summary"]["modes"]
    assert summary["bi"]["seeds"] == [1106, 1107] and summary["l2r"]["seeds"] == [1106]
    bi = json.loads((out / "runs" / "bi-seed1106.json").read_text())
    assert len(bi["train"]["losses"]) == bi["train"]["steps"] > 0
    assert 0 <= bi["processbench"]["fixed"]["average_f1"] <= 100
    assert "overall" in bi["prmbench"]["classes"] and bi["bon"]["ns"] == [2, 4, 8, 12]
    assert len(bi["sigma_by_position"]["mean"]) == 10
    for name in (
        "report.md",
        "results.json",
        "sigma_by_position.png",
        "mae_by_position.png",
        "sigma_histograms.png",
        "data_report.json",
    ):
        assert (out / name).is_file(), name
    assert "PRMScore overall" in (out / "report.md").read_text()

    # a rerun finds every run done and trains nothing
    stamp = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    replicate(cfg)
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamp

    # every run keeps its final model and its per-item logits in the work dir
    folder = run_folder(cfg, "bi-seed1106")
    assert (folder / "model.safetensors").is_file() and (folder / "scores.npz").is_file()

    # the report alone, from what has finished: each run's metrics are recomputed from its logits
    path = out / "runs" / "bi-seed1106.json"
    path.write_text(json.dumps(bi | {"bon": None, "processbench": None}))
    (out / "report.md").unlink()
    assert report_only(cfg)["summary"]["modes"]["bi"]["seeds"] == [1106, 1107] and (out / "report.md").is_file()
    assert json.loads(path.read_text()) == bi


def test_a_results_folder_of_another_study_is_refused(tmp_path):
    from studies.replication.recipe import check_study

    cfg = ReplicateConfig(
        preset="toy", out=str(tmp_path), work_dir=str(tmp_path / "w"), data_root="/data", processbench_rows=6
    )
    (tmp_path / "meta.json").write_text(json.dumps({"config": dataclasses.asdict(cfg)}))
    check_study(dataclasses.replace(cfg, work_dir="/elsewhere", data_root="/other"))  # paths are not the study
    with pytest.raises(ValueError, match=r"holds the runs of another study \(processbench_rows: 6 then, 30 now\)"):
        check_study(dataclasses.replace(cfg, processbench_rows=30))


def test_a_study_keeps_glibcs_mmap_threshold_and_trims_between_runs(tmp_path, monkeypatch):
    # A threshold pinned at 1 MiB mapped every 1-32 MiB tensor fresh: 30 % of the quick preset's CPU time in the kernel.
    from studies.replication import recipe

    class Libc:
        def __getattr__(self, name):
            return lambda *args: calls.append((name, *args))

    calls = []
    monkeypatch.setattr(recipe, "_malloc", lambda call: call(Libc()))
    recipe.start(ReplicateConfig(preset="toy", out=str(tmp_path), work_dir=str(tmp_path / "w"), data_root="/data"))
    assert calls == []
    recipe.release_memory()
    assert calls == [("malloc_trim", 0)]


@pytest.mark.parametrize("env, expected", [("1", 1), (None, "affinity")])
def test_a_study_takes_its_thread_count_from_omp_num_threads_else_the_cores_it_may_use(
    tmp_path, monkeypatch, env, expected
):
    # Forced to every core while other work ran on the 2 shared
    # cores, a mechanism run took 24 s a step; one thread, 7 s.
    import os

    import torch

    from studies.replication import recipe

    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    before = torch.get_num_threads()
    try:
        recipe.start(ReplicateConfig(preset="toy", out=str(tmp_path), work_dir=str(tmp_path / "w"), data_root="/data"))
        assert torch.get_num_threads() == (len(os.sched_getaffinity(0)) if expected == "affinity" else expected)
    finally:
        torch.set_num_threads(before)


def test_a_setting_added_since_a_study_ran_is_no_change_at_its_default(tmp_path):
    # mechanism version 1 recorded its config before `labels` and `keep_roundness` existed
    from studies.mechanism.config import MechanismConfig
    from studies.replication.recipe import check_study

    cfg = MechanismConfig(out=str(tmp_path), work_dir=str(tmp_path / "w"))
    recorded = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("labels", "keep_roundness")}
    (tmp_path / "meta.json").write_text(json.dumps({"config": recorded}))
    check_study(cfg)
    with pytest.raises(ValueError, match="keep_roundness: None then, True now"):
        check_study(dataclasses.replace(cfg, keep_roundness=True))
