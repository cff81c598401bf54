"""Finished runs -> results.json, report.md and figures, in the shape of the paper's tables.

Every number is mean ± sample standard deviation over the seeds of a mode (just the
value where a mode has one seed). Only runs whose JSON exists are read, so the report
of an interrupted study is correct for what it covers and says how many seeds it has.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from biprm.analysis.common import markdown_table
from biprm.analysis.plots import figure, plot_curves, write_figure
from biprm.config import MODES
from biprm.evaluation.outputs import write_json


def _stat(values: list[float | None]) -> dict:
    v = np.array([np.nan if x is None else x for x in values], dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else None, "n": int(len(v))}


def _cell(s: dict, digits: int = 1) -> str:
    if s["mean"] is None:
        return "–"
    return f"{s['mean']:.{digits}f}" + (f" ± {s['std']:.{digits}f}" if s["std"] is not None else "")


def _get(run: dict, path: str):
    value = run
    for key in path.split("/"):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _modes(runs: list[dict]) -> list[str]:
    """Table order: the training modes as MODES lists them, then the gate-study variants by name."""
    names = {r["mode"] for r in runs}
    return [m for m in MODES if m in names] + sorted(names - set(MODES))


def summarise(runs: list[dict]) -> dict:
    """{mode: {metric path: stat}} for the headline metrics, and the score-free baselines."""
    modes = _modes(runs)
    first = runs[0]
    subsets = list(first["processbench"]["fixed"]["subsets"])
    paths = [f"processbench/{t}/subsets/{s}/f1" for t in ("fixed", "tuned") for s in subsets]
    paths += ["processbench/fixed/average_f1", "processbench/tuned/average_f1", "processbench/tuned/threshold"]
    paths += [
        "prmbench/classes/overall/prm_score",
        *(f"prmbench/categories/{c}" for c in first["prmbench"]["categories"]),
    ]
    paths += [f"prmbench/classes/{c}/prm_score" for c in first["prmbench"]["classes"] if c != "overall"]
    paths += ["bon/mean/bon", *(f"bon/bon/{n}" for n in first["bon"]["ns"]), "valid/bce", "valid/f1"]
    table = {m: {"seeds": sorted(r["seed"] for r in runs if r["mode"] == m)} for m in modes}
    for m in modes:
        mine = [r for r in runs if r["mode"] == m]
        table[m] |= {p: _stat([_get(r, p) for r in mine]) for p in paths}
    return {"modes": table, "subsets": subsets, "bon_ns": first["bon"]["ns"]}


def _tables(s: dict) -> list[str]:
    modes, subsets, ns = s["modes"], s["subsets"], s["bon_ns"]
    seeds = lambda m: str(len(modes[m]["seeds"]))  # noqa: E731
    pb_rows = [
        [
            m,
            seeds(m),
            *(_cell(modes[m][f"processbench/fixed/subsets/{x}/f1"]) for x in subsets),
            _cell(modes[m]["processbench/fixed/average_f1"]),
            *(_cell(modes[m][f"processbench/tuned/subsets/{x}/f1"]) for x in subsets),
            _cell(modes[m]["processbench/tuned/average_f1"]),
        ]
        for m in modes
    ]
    pb = markdown_table(
        [
            "mode",
            "seeds",
            *(f"{x} F1@0.5" for x in subsets),
            "avg F1@0.5",
            *(f"{x} F1@tuned" for x in subsets),
            "avg F1@tuned",
        ],
        pb_rows,
        left=2,
    )
    cats = [k.split("/")[-1] for k in next(iter(modes.values())) if k.startswith("prmbench/categories/")]
    prm_rows = [
        [
            m,
            seeds(m),
            _cell(modes[m]["prmbench/classes/overall/prm_score"]),
            *(_cell(modes[m][f"prmbench/categories/{c}"]) for c in cats),
        ]
        for m in modes
    ]
    prm = markdown_table(["mode", "seeds", "PRMScore overall", *cats], prm_rows, left=2)
    bon_rows = [
        [m, seeds(m), *(_cell(modes[m][f"bon/bon/{n}"]) for n in ns), _cell(modes[m]["bon/mean/bon"])] for m in modes
    ]
    bon = markdown_table(["mode", "seeds", *(f"BoN@{n}" for n in ns), "mean"], bon_rows, left=2)
    val_rows = [[m, seeds(m), _cell(modes[m]["valid/bce"], 4), _cell(modes[m]["valid/f1"])] for m in modes]
    val = markdown_table(["mode", "seeds", "validation BCE", "validation first-error F1@0.5"], val_rows, left=2)
    return [
        "### ProcessBench (F1, %)",
        pb,
        "### PRMBench (PRMScore, %)",
        prm,
        "### Best-of-N on gsm8k_bon_small (accuracy, %, aggregation min)",
        bon,
        "### Validation split",
        val,
    ]


def position_prior(train: list, trajs: list, source: str | None = None) -> np.ndarray:
    """P(step correct | source, step index, step count) for every step of `trajs`, fitted on the training
    labels and backing off to P(correct | source, step index): a step scorer that reads no text. `source`
    overrides the rows' own (for evaluation rows that carry none)."""
    fine: dict[tuple, list[float]] = {}
    coarse: dict[tuple, list[float]] = {}
    for t in train:
        for i, y in enumerate(t.labels):
            for table, key in ((fine, (t.meta["source"], i, len(t.steps))), (coarse, (t.meta["source"], i))):
                table.setdefault(key, []).append(y)
    probs = []
    for t in trajs:
        src = source or t.meta["source"]
        for i in range(len(t.steps)):
            back = coarse.get((src, i), [])
            prior = (sum(back) + 1) / (len(back) + 2)
            seen = fine.get((src, i, len(t.steps)), [])
            probs.append((sum(seen) + 2 * prior) / (len(seen) + 2))
    return np.array(probs)


def position_prior_bce(train: list, valid: list) -> float:
    """Validation BCE (mean over steps) of `position_prior`."""
    p = position_prior(train, valid)
    y = np.array([y for t in valid for y in t.labels])
    return float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))


def content_free(cfg: dict) -> tuple[dict, list[str]]:
    """What scorers that read no text get on the study's own ProcessBench rows and BoN questions, with
    95 % intervals over questions: the rows every model number must be read against."""
    from biprm.evaluation.bon import bon_rows, summarise as summarise_bon
    from biprm.data.benchmarks import load_processbench
    from biprm.evaluation.pools import load_pool
    from biprm.evaluation.processbench import evaluate_processbench
    from studies.replication.data import DataRecipe, build
    from studies.replication.evaluate import BON_NS, prmbench_report, read_prmbench
    from biprm.scoring.step_scores import StepScores, offsets_of
    from biprm.scoring.aggregate import logit

    if not Path(cfg["data_root"]).is_dir():
        return {}, [f"(content-free rows not computed: data folder {cfg['data_root']} not found)"]
    pb = evaluate_processbench(
        load_processbench(cfg["data_root"], tuple(cfg["processbench_subsets"]), cfg["processbench_rows"]), {}
    )
    pool = load_pool("gsm8k_bon_small", cfg["data_root"], cfg["bon_questions"])
    bon = summarise_bon(bon_rows(pool, {}, "min", BON_NS, "first"), [])["rows"]
    train, valid, _ = build(cfg["data_root"], DataRecipe(**cfg["data"]))
    prior = position_prior_bce(train, valid)
    prm_trajs, prm_book = read_prmbench(cfg["data_root"], cfg["prmbench_rows"])
    offsets = offsets_of([len(t.steps) for t in prm_trajs])
    prm_free = {
        name: prmbench_report(prm_trajs, StepScores(offsets, logit(p)))
        for name, p in {
            "P(step correct | step index, step count), fitted on the PRMBench training labels": position_prior(
                train, prm_trajs, "prmbench"
            ),
            "every step correct (constant score)": np.full(offsets[-1], 0.75),
        }.items()
    }
    cell = lambda c: f"{c['mean']:.1f} [{c['low']:.1f}, {c['high']:.1f}]"  # noqa: E731
    subsets = pb["subsets"]
    cats = list(next(iter(prm_free.values()))["categories"])
    pb_rows = [
        [name, *(f"{b['subsets'][x]['f1']:.1f}" for x in subsets), f"{b['average_f1']:.1f}"]
        for name, b in pb["baselines"].items()
    ]
    bon_md = [[name, *(cell(r[n]) for n in BON_NS), cell(r["mean"])] for name, r in bon.items()]
    md = [
        "### Content-free rows on the same items",
        "Scorers that read no step text, on the same ProcessBench rows and the same BoN questions (first n, `min`), "
        "with 95 % bootstrap intervals over questions. A model inside these intervals has shown nothing.",
        markdown_table(["rule", *(f"{x} F1" for x in subsets), "avg F1"], pb_rows),
        markdown_table(["scorer", *(f"BoN@{n}" for n in BON_NS), "mean"], bon_md),
        f"PRMBench: PRMScore overall with a 95 % interval from 1000 resamples of its {_prm_questions(prm_free)} "
        "questions (a question's original and modified processes drawn together, the steps of the drawn processes "
        "pooled again); categories without intervals. "
        f"Processes: {prm_book['processes_read']} read, {prm_book['repeats_left_out']} left out as repeats of a "
        f"(class, idx) the reference scores once, {prm_book['past_prmbench_rows']} past --prmbench-rows, "
        f"{prm_book['processes']} scored.",
        markdown_table(
            ["PRMBench scorer", "PRMScore overall", *cats],
            [[name, _overall(r), *(f"{r['categories'][c]:.1f}" for c in cats)] for name, r in prm_free.items()],
        ),
        "Validation BCE of a table of P(label | source, step index, step count) fitted on the training labels: "
        f"{prior:.4f}.",
    ]
    free = {"processbench": pb["baselines"], "bon": bon, "prmbench": prm_free, "prmbench_ledger": prm_book}
    return free | {"valid_bce_position_prior": prior}, md


def _prm_questions(prm_free: dict) -> int:
    return next(iter(prm_free.values()))["questions"]


def _overall(report: dict) -> str:
    """PRMBench's overall PRMScore, with its interval over questions (`prm_score_intervals`)."""
    low, high = report["intervals"]["overall"]
    return f"{report['classes']['overall']['prm_score']:.1f} [{low:.1f}, {high:.1f}]"


def _figures(out: Path, runs: list[dict]) -> list[str]:
    bi = [r for r in runs if "sigma_by_position" in r]
    md = []
    if bi:
        plot_curves(
            str(out / "sigma_by_position.png"),
            {f"{r['mode']} seed {r['seed']}": r["sigma_by_position"] for r in bi},
            ylabel=r"mean gate $\sigma_t$ (weight on L2R)",
            title="Gate weight by step position (ProcessBench)",
            hline=0.5,
            hline_label="equal weight",
            ylim=(0.0, 1.0),
        )
        _plot_histograms(out / "sigma_histograms.png", bi[0]["sigma_histograms"], bi[0]["seed"])
        md += ["![gate by position](sigma_by_position.png)", "![gate histograms](sigma_histograms.png)"]
    curves = {}
    for m in MODES:
        mine = [r["mae_by_position"] for r in runs if r["mode"] == m]
        if mine:
            stacked = np.array([[np.nan if v is None else v for v in c["mean"]] for c in mine], dtype=float)
            curves[m] = {
                "position": mine[0]["position"],
                "mean": [None if np.isnan(v) else float(v) for v in np.nanmean(stacked, 0)],
            }
    plot_curves(
        str(out / "mae_by_position.png"),
        curves,
        ylabel=r"MAE $|p_t - y_t|$",
        title="Step-wise MAE by position (ProcessBench)",
    )
    md.append("![MAE by position](mae_by_position.png)")
    return md


def _plot_histograms(path: Path, h: dict, seed: int) -> None:
    share = np.array(h["share"])
    fig, axes = figure(1, len(share), figsize=(2.2 * len(share), 2.6), sharey=True)
    edges = np.array(h["sigma_edges"])
    for ax, row, pos, n in zip(np.atleast_1d(axes), share, h["position"], h["count"]):
        ax.bar(edges[:-1], row, width=np.diff(edges), align="edge", color="tab:purple")
        ax.set_title(f"position {pos:.0%} (n={n})", fontsize=8)
        ax.set_xlabel(r"$\sigma_t$")
        ax.set_xlim(0, 1)
    np.atleast_1d(axes)[0].set_ylabel("share of steps")
    fig.suptitle(f"Gate values by step position, bi seed {seed}", fontsize=9)
    write_figure(fig, path, dpi=110)


def write_report(out: Path, meta: dict) -> dict:
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    if not runs:
        raise RuntimeError(f"no finished runs under {out / 'runs'}")
    summary = summarise(runs)
    free, free_md = content_free(meta["config"])
    results = {**meta, "summary": summary, "content_free": free, "runs": [r["run"] for r in runs]}
    write_json(out / "results.json", results)
    cfg = meta["config"]
    head = [
        f"# Replication, preset `{cfg['preset']}`",
        f"Backbone `{cfg['backbone']}`, top {cfg['top_layers']} layers trained on a frozen trunk; "
        f"{'bf16 autocast' if meta['bf16'] else 'fp32'}; sizes {meta['sizes']}; {len(runs)} finished runs.",
    ]
    text = "\n\n".join(head + _tables(summary) + free_md + _figures(out, runs)) + "\n"
    (out / "report.md").write_text(text)
    print("\n\n".join(head + _tables(summary) + free_md))  # the tables, on screen as in the report; figures apart
    print(f"\nwrote {out / 'report.md'} and {out / 'results.json'}")
    return results
