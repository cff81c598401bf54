"""Targets, Markdown tables and the scaling plot of a `python -m benchmarks` result."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from biprm.analysis.plots import figure, write_figure

TRAIN_BI, TRAIN_L2R = "bi:tree", "l2r:plain"  # the layouts `biprm train` uses
BON_BI = "bi:kv"


def _ratio(rows: dict, a: str, b: str, key: str = "median_s") -> float:
    return rows[a][key] / rows[b][key]


def targets(result: dict) -> list[dict]:
    """The issue's targets in fp32 (equal dtype on both sides): wall-clock ratios, and the same
    ratios of process CPU time, which a busy neighbour on a shared machine disturbs less."""
    run = result["runs"]["float32"]
    train, bon, peak = run["train"]["rows"], run["bon"]["rows"], result["matmul_peak"]["float32"]["gflops"]
    ref_scale = bon["ref-bi"]["pool_s"] / bon["ref-bi"]["median_s"]  # the reference ran on a sample of the pool
    times = [
        ("training step: ref-bi / bi", train, "ref-bi", TRAIN_BI, 1.0, ">=", 1.5),
        ("training step: bi / l2r (same optimisations)", train, TRAIN_BI, TRAIN_L2R, 1.0, "<=", 2.0),
        ("Best-of-N pool: ref-bi / bi", bon, "ref-bi", BON_BI, ref_scale, ">=", 4.0),
        ("Best-of-N pool: bi / plain l2r scorer", bon, BON_BI, "l2r:plain", 1.0, "<=", 1.5),
        ("Best-of-N pool: bi / l2r (same optimisations)", bon, BON_BI, "l2r:kv", 1.0, "<=", 2.0),
    ]
    out = [
        (n, rows[a]["median_s"] / rows[b]["median_s"] * k, rows[a]["cpu_median_s"] / rows[b]["cpu_median_s"] * k, op, g)
        for n, rows, a, b, k, op, g in times
    ]
    if "memory" in train[TRAIN_BI]:
        out.append(
            (
                "training step peak memory: bi / ref-bi",
                train[TRAIN_BI]["memory"]["step_mib"] / train["ref-bi"]["memory"]["step_mib"],
                None,
                "<=",
                1.0,
            )
        )
    out += [
        ("FLOP/s of fp32 matmul peak, training step (bi)", train[TRAIN_BI]["gflops_per_s"] / peak, None, None, None),
        ("FLOP/s of fp32 matmul peak, Best-of-N scoring (bi)", bon[BON_BI]["gflops_per_s"] / peak, None, None, None),
    ]
    met = lambda v, op, goal: None if op is None else (v >= goal if op == ">=" else v <= goal)  # noqa: E731
    return [
        {"target": n, "value": v, "cpu_value": c, "op": op, "goal": g, "met": met(v, op, g)} for n, v, c, op, g in out
    ]


def _table(header: list[str], rows: list[list]) -> str:
    cell = lambda x: "–" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows])


def write_markdown(result: dict, path: str) -> str:
    cfg, m = result["config"], result["machine"]
    peaks = result["matmul_peak"]
    parts = [
        f"# biprm bench: {cfg['shape']} shape ({cfg['preset']} preset)",
        f"{m['lscpu'].get('Model name', '?')}, {m['lscpu'].get('CPU(s)', '?')} CPUs ({', '.join(m['simd'])}), "
        f"{m['memory_gib']} GiB; torch {m['torch']}, {m['threads']} threads. Matmul peak: "
        + ", ".join(f"{k} {v['gflops']:.1f} GFLOP/s (n={v['n']})" for k, v in peaks.items())
        + f"; oneDNN bf16: {m['mkldnn_bf16']}. Load average at start {result['loadavg_start'][0]:.2f}, "
        f"at end {result['loadavg_end'][0]:.2f}. Dtypes run: {', '.join(result['dtypes'])}. "
        f"The whole run took {result['elapsed_s'] / 60:.1f} min.",
        "## Targets (fp32, ratios of medians taken in this run)",
        _table(
            ["target", "measured (wall)", "same, CPU time", "goal", "met"],
            [
                [t["target"], t["value"], t["cpu_value"], f"{t['op']} {t['goal']}" if t["op"] else "report", t["met"]]
                for t in result["targets"]
            ],
        ),
    ]
    for dtype, run in result["runs"].items():
        peak = peaks[dtype]["gflops"]
        train = run["train"]
        rows = train["rows"]
        parts += [
            f"## Training step, {dtype}: batch {train['batch']}, stream tokens {train['tokens_per_stream']}, prompts "
            f"{train['prompts']}",
            _table(
                [
                    "config",
                    "rows x width",
                    "median s",
                    "CPU s",
                    "max/min",
                    "ref-bi / this",
                    "GFLOP/s",
                    "of peak",
                    "step MiB",
                    "peak RSS MiB",
                ],
                [
                    [
                        k,
                        "x".join(map(str, r["layout"])) if r["layout"] else "4 passes" if k == "ref-bi" else "1 pass",
                        r["median_s"],
                        r["cpu_median_s"],
                        r["spread"],
                        _ratio(rows, "ref-bi", k),
                        r["gflops_per_s"],
                        None if r["gflops_per_s"] is None else r["gflops_per_s"] / peak,
                        r.get("memory", {}).get("step_mib"),
                        r.get("memory", {}).get("peak_mib"),
                    ]
                    for k, r in rows.items()
                ],
            ),
        ]
        lat = run["latency"]["rows"]
        parts += [
            f"## Single-solution latency, {dtype}: {run['latency']['solutions']} solutions of "
            f"{run['latency']['tokens']} tokens, one at a time",
            _table(
                ["config", "ms per solution", "max/min", "ref-bi / this", "this / l2r:plain", "GFLOP/s"],
                [
                    [
                        k,
                        1e3 * r["per_solution_s"],
                        r["spread"],
                        _ratio(lat, "ref-bi", k),
                        _ratio(lat, k, "l2r:plain"),
                        r["gflops_per_s"],
                    ]
                    for k, r in lat.items()
                ],
            ),
        ]
        bon = run["bon"]
        rows = bon["rows"]
        parts += [
            f"## Best-of-N, {dtype}: gsm8k_bon_small, {bon['questions']} questions x 12 candidates = "
            f"{bon['solutions']} solutions, "
            f"{bon['tokens']} tokens (one stream); reference timed on {bon['ref_sample']} random candidates and scaled "
            "to the pool",
            _table(
                [
                    "config",
                    "pool s",
                    "solutions/s",
                    "tokens/s",
                    "ref-bi / this",
                    "this / l2r:plain",
                    "GFLOP/s",
                    "of peak",
                ],
                [
                    [
                        k,
                        r["pool_s"],
                        r["solutions_per_s"],
                        r["tokens_per_s"],
                        _ratio(rows, "ref-bi", k, "pool_s"),
                        _ratio(rows, k, "l2r:plain", "pool_s"),
                        r["gflops_per_s"],
                        r["gflops_per_s"] / peak,
                    ]
                    for k, r in rows.items()
                ],
            ),
            f"Largest score difference between the bi paths: {bon['max_abs_diff_bi_paths']:.2g}; "
            f"between bi and the reference pattern: {bon['max_abs_diff_vs_reference']:.2g}.",
        ]
    g = result["gate_overhead"]
    parts += [
        "## Gate parameters at Qwen2.5-Math-1.5B's shape (meta device)",
        f"L2R PRM (body + value head) {g['l2r_total'] / 1e9:.4f}B, BiPRM {g['bi_total'] / 1e9:.4f}B: the gate adds "
        f"{g['gate'] / 1e6:.2f}M parameters ({100 * g['gate_fraction']:.2f} %). The paper reports 1.543B -> 1.548B.",
        "## fp32 full-vocabulary logits the reference pattern materialises per stream and pass (B x L x V x 4 bytes)",
        _table(
            ["vocab", "batch", "length", "GiB"],
            [[r["vocab"], r["batch"], r["length"], r["gib"]] for r in result["logits_memory"]],
        ),
    ]
    text = "\n\n".join(parts) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def plot_scaling(scaling: dict, path: str, shape: str) -> None:
    fig, (a, b) = figure(1, 2, figsize=(11, 4))
    for name, ys in scaling["candidates"].items():
        a.plot(scaling["counts"], ys, marker="o", label=name)
    for name, ys in scaling["length"].items():
        b.plot(scaling["lengths"], ys, marker="o", label=name)
    a.set(xlabel="candidates of one question", ylabel="seconds", title="cost vs candidates (ref-bi: per-candidate x N)")
    b.set(
        xlabel="tokens per stream (one solution)",
        ylabel="seconds",
        title="cost vs solution length",
        xscale="log",
        yscale="log",
    )
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"biprm bench, {shape} shape, fp32")
    write_figure(fig, path)


def save(result: dict, out: str, stem: str, markdown: Callable[[dict, str], str], show: bool = True) -> Path:
    """A preset's result as OUT/STEM.json and OUT/STEM.md (written by `markdown`, and printed unless not `show`): one
    layout for every preset."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=1, default=float))
    text = markdown(result, str(folder / f"{stem}.md"))
    if show:
        print(text)
    return folder
