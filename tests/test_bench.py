"""`python -m benchmarks` code paths on the tiny shape: every section runs and reports; no timing is asserted."""

import json
import math

import numpy as np
import pytest
import torch

from benchmarks.config import PRESETS
from benchmarks.measure import step_memory
from benchmarks.run import BenchConfig, gate_overhead, main
from benchmarks.workload import build, training_config
from biprm.data.encoding import Encoded
from biprm.data.trajectory import Trajectory

TRAJS = [
    Trajectory(
        "Tom has 3 bags of 7 apples. He eats 2. How many are left?",
        ["3 * 7 = 21 apples.", "21 - 2 = 19.", "The answer is 19."],
    ),
    Trajectory(
        "Tom has 3 bags of 7 apples. He eats 2. How many are left?", ["3 * 7 = 24 apples.", "The answer is 22."]
    ),
    Trajectory("Ann reads 12 pages a day for 5 days. How many pages?", ["12 * 5 = 60.", "The answer is 60."]),
]


def labelled(bench) -> list[Encoded]:
    encs = [bench.encoder().encode(t) for t in TRAJS]
    return [Encoded(e.prompt, e.steps, [1.0] * len(e.steps)) for e in encs]


def test_bench_smoke_on_tiny_shape(data_dir, tmp_path, capsys):
    main(BenchConfig(shape="tiny", preset="smoke", data_root=str(data_dir), out=str(tmp_path), threads=1, memory=False))
    said = (
        capsys.readouterr().err.splitlines()
    )  # what it measures and where it writes, then each stage with the time left
    assert said[0].startswith("python -m benchmarks --preset smoke: the tiny shape") and f"go to {tmp_path}/" in said[0]
    assert "[1/4] float32: training step: " in said[2] and "so far, about " in said[2] and "left" in said[2]
    assert said[-1].startswith("[4/4] float32: scaling curve: ") and "left" not in said[-1]
    result = json.loads((tmp_path / "bench-tiny-smoke.json").read_text())
    assert (tmp_path / "bench-tiny-smoke.md").read_text().startswith("# biprm bench: tiny shape")
    assert (tmp_path / "bench-tiny-smoke-scaling.png").stat().st_size > 0
    assert {t["target"] for t in result["targets"]} >= {"training step: ref-bi / bi", "Best-of-N pool: ref-bi / bi"}
    assert all(math.isfinite(t["value"]) and t["value"] > 0 for t in result["targets"])
    bon = result["runs"]["float32"]["bon"]
    assert bon["max_abs_diff_bi_paths"] < 1e-4 and bon["max_abs_diff_vs_reference"] < 1e-4


def test_reference_pattern_computes_the_same_loss():
    """The baseline differs from BiPRM in cost only: same heads on the same body, same loss."""
    bench = build("tiny")
    encs = labelled(bench)
    for mode in ("l2r", "bi"):
        ours, inputs = training_config(bench, encs, f"{mode}:tree")
        ref, ref_inputs = training_config(bench, encs, f"ref-{mode}")
        with torch.no_grad():
            assert abs(ours(**inputs).loss.item() - ref(**ref_inputs).loss.item()) < 1e-5


def test_memory_probe_reports_the_step_peak():
    probe = step_memory("tiny", labelled(build("tiny")), "bi:tree", threads=1)
    assert probe["peak_mib"] >= probe["steady_mib"] > 0


def test_gate_overhead_at_qwen25_math_15b_shape():
    """The paper: 1.543B -> 1.548B parameters."""
    g = gate_overhead()
    H = 1536
    assert g["gate"] == 2 * H * H + H + H + 1
    assert round(g["l2r_total"] / 1e9, 3) in (1.543, 1.544) and round(g["bi_total"] / 1e9, 3) == 1.548


def test_each_configuration_pins_its_layout():
    """Left to itself Scorer picks the prompt cache for Best-of-N pools; the bench must not let it."""
    from benchmarks.run import scorer

    bench = build("tiny")
    layouts = {
        name: scorer(bench, name).prefix_cache for name in ("l2r:plain", "bi:plain", "bi:default", "bi:kv", "l2r:kv")
    }
    assert layouts == {"l2r:plain": False, "bi:plain": False, "bi:default": False, "bi:kv": True, "l2r:kv": True}


def test_bench_data_rows_chain_solutions_to_the_asked_length(data_dir, tmp_path):
    from benchmarks.config import DataBenchConfig
    from benchmarks.data import write_rows
    from biprm.data.readers import load_trajectories

    steps = {}
    for per_row in (1.0, 2.5):
        write_rows(tmp_path / f"{per_row}.jsonl", 400, str(data_dir), per_row, seed=1)
        trajs = load_trajectories(str(tmp_path / f"{per_row}.jsonl"))
        assert len(trajs) == 400 and all(len(t.labels) == len(t.steps) for t in trajs)
        steps[per_row] = np.mean([len(t.steps) for t in trajs])
    assert 2.2 < steps[2.5] / steps[1.0] < 2.8  # half the rows chain 2 solutions, half 3
    assert (
        DataBenchConfig(rows=10).name == "data-10"
        and DataBenchConfig(rows=10, solutions_per_row=2.7).name == "data-10-x2.7"
    )


@pytest.mark.slow
def test_serve_preset_runs_bounded_and_serves_the_scorers_scores(tmp_path, data_dir):
    from benchmarks.serve import run, write

    cfg = BenchConfig(
        preset="serve",
        shape="tiny",
        data_root=str(data_dir),
        requests=8,
        concurrency=[1, 4],
        compare_at=4,
        overload_clients=24,
        overload_queue=2,
    )
    result = run(cfg)
    assert result["max_abs_diff_vs_scorer"] < 1e-5
    assert result["runs"]["batched"]["4"]["ok"] == 8 and result["runs"]["one-at-a-time"]["4"]["ok"] == 8
    assert (
        result["overload"]["rejected_503"] > 0
        and result["overload"]["ok"] + result["overload"]["rejected_503"] == result["overload"]["sent"]
    )
    assert "one-at-a-time" in write(result, str(tmp_path)).with_suffix(".md").read_text()


def test_no_benchmark_writes_the_committed_results_unless_told():
    """A bare `python -m benchmarks ...` writes to out/benchmarks; only --out benchmarks replaces committed files."""
    from benchmarks.config import SCRATCH, BoundaryBenchConfig, DataBenchConfig

    assert SCRATCH == "out/benchmarks"
    assert {c.__name__: c().out for c in (BenchConfig, DataBenchConfig, BoundaryBenchConfig)} == dict.fromkeys(
        ("BenchConfig", "DataBenchConfig", "BoundaryBenchConfig"), SCRATCH
    )


def test_a_run_sets_the_sizes_it_names_and_takes_the_rest_from_its_preset():
    assert BenchConfig(preset="serve").sizes == PRESETS["serve"]
    sizes = BenchConfig(preset="vllm", requests=8, compare_at=2).sizes
    assert sizes == PRESETS["vllm"] | {"requests": 8, "compare_at": 2} and PRESETS["vllm"]["requests"] == 64
    assert BenchConfig(preset="quick", questions=3).sizes["questions"] == 3
    with pytest.raises(
        ValueError, match="--overload-clients: the vllm preset has no such size; it takes --questions, --requests"
    ):
        BenchConfig(preset="vllm", overload_clients=8)


def test_bench_presets_run_the_server_benchmarks(monkeypatch):
    """`python -m benchmarks --preset serve|vllm` run the load test and the vLLM comparison, with the sizes the flags
    set."""
    import benchmarks.serve
    import benchmarks.vllm
    from benchmarks.__main__ import main
    from biprm.cli import run_program

    cli = lambda argv: run_program(BenchConfig, main, "python -m benchmarks", argv)  # noqa: E731

    ran = []
    for module in (benchmarks.serve, benchmarks.vllm):
        monkeypatch.setattr(module, "run", lambda cfg, name=module.__name__: ran.append((name, cfg.sizes)) or {})
        monkeypatch.setattr(module, "write", lambda result, out: None)
    cli(["--preset", "serve", "--requests", "8", "--concurrency", "1", "4"])
    cli(["--preset", "vllm"])
    assert ran == [
        ("benchmarks.serve", PRESETS["serve"] | {"requests": 8, "concurrency": [1, 4]}),
        ("benchmarks.vllm", PRESETS["vllm"]),
    ]


def test_the_boundary_table_recuts_processbench_rows_per_join_and_segmenter(tmp_path):
    from benchmarks.boundaries import STEM, markdown, run
    from benchmarks.config import BoundaryBenchConfig
    from benchmarks.report import save

    steps = [
        "Let x = 2.",
        "So x + 1 = 3, and therefore the answer is 3, which we check by substituting x back into it.",
    ]
    (tmp_path / "long.json").write_text(
        json.dumps([{"id": i, "problem": "q", "steps": steps, "label": label} for i, label in (("a", -1), ("b", 1))])
    )
    cfg = BoundaryBenchConfig(
        data_root=str(tmp_path),
        subsets=[str(tmp_path / "long.json")],
        segmenters=["paragraph", "lines"],
        resamples=10,
        out=str(tmp_path / "out"),
    )
    result = run(cfg)
    blank, space = result["joins"][repr("\n\n")], result["joins"][repr(" ")]
    assert (
        blank["paragraph"]["all"]["found"]["mean"] == 1.0 and space["paragraph"]["all"]["found"]["mean"] == 0.0
    )  # the layout, or none
    assert space["lines"]["all"]["cut_steps"] == 1.0 and result["subsets"] == {"long": 2}
    save(result, cfg.out, STEM, markdown)
    assert "| a space | paragraph | 1.0 | 0.0 [0.0, 0.0]" in (tmp_path / "out" / f"{STEM}.md").read_text()


def test_the_boundary_table_scores_each_cut_with_a_model_and_maps_first_errors_back(tmp_path):
    from benchmarks.boundaries import run
    from benchmarks.config import BoundaryBenchConfig
    from biprm.config import TrainConfig
    from biprm.training import train

    model = train(
        TrainConfig(
            backbone="tiny",
            data="synthetic:8",
            max_steps=1,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            output_dir=str(tmp_path / "m"),
            save_steps=10**9,
            show_progress=False,
        )
    )
    steps = ["Let x = 2.\nThen x + 1 = 3.", "So the answer is 4."]
    rows = [{"id": f"r{i}", "problem": "q", "steps": steps, "label": label} for i, label in enumerate((-1, 1))]
    (tmp_path / "long.json").write_text(json.dumps(rows))
    cfg = BoundaryBenchConfig(
        data_root=str(tmp_path),
        subsets=[str(tmp_path / "long.json")],
        segmenters=["lines"],
        joins=[" "],
        resamples=10,
        model=model,
        max_length=64,
        threshold=1.0,
    )  # threshold 1: every step is an error
    f1 = run(cfg)["first_error"]
    # every row's first error is the first cut's first step, in given step 0: right on no row (labels -1 and 1)
    assert (
        f1[f"{model}: the given steps"]["mean"] == 0.0
        and f1[f"{model}: joined by a space, cut by lines"]["mean"] == 0.0
    )
    assert set(f1) == {
        "flag nothing (text-free)",
        "flag step 0 (text-free)",
        f"{model}: the given steps",
        f"{model}: joined by a space, cut by lines",
        "flag step k when there are more than k (k = 0, tuned on these rows: an upper bound; text-free)",
    }
