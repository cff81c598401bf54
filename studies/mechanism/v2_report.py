"""Version 2's report (studies/mechanism/README.md), computed from the saved logits alone.

Every arm and every scorer that reads no model (the format rule, the rounder-number rule, the
position rules, noise) goes through the same endpoint code (`mechanism_v2.endpoints`), with 95 %
intervals over seeds and questions; the paired differences the verdict reads are at 97.5 % (two bi
arms are judged), and the verdict is the pre-registered rule (`mechanism_v2.verdict`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import numpy as np

from biprm.analysis.common import first_errors, markdown_table
from biprm.analysis.plots import plot_curves, plot_intervals
from biprm.data.trajectory import Trajectory
from biprm.metrics.bootstrap import bootstrap_mean, paired_difference
from biprm.metrics.first_error import flag_step, tune_flag_step
from biprm.evaluation.outputs import write_json
from studies.mechanism.config import MechanismConfig
from studies.mechanism.rows import KINDS, load_sets, row_labels
from studies.mechanism.report import (
    _at,
    _cell,
    _collect,
    bon_tables,
    check_meta,
    most_frequent_step,
    processbench_tables,
    rows_by_kind,
    run_metrics,
)
from studies.mechanism.v2 import (
    LEVEL,
    below_every_clean_step,
    chance_below_every_clean_step,
    clean_pass_threshold,
    endpoints,
    format_rule,
    loss_floor,
    minimum_detectable_effect,
    noise,
    position_rule,
    rounder_number_rule,
    verdict,
)
from studies.mechanism.v2_reread import format_reread, reread
from biprm.scoring.step_scores import StepScores

ARMS = ("bi", "bi-gate-lr0.1")
PRIMARY = "primary: F's step t below every step of C"
VERDICT_ENDPOINTS = (PRIMARY, "P1: F rows, first error exact", "P2: L rows, first error exact")
DIFFERENCES = (
    ("bi", "l2r"),
    ("bi-gate-lr0.1", "l2r"),
    ("bi", "r2l"),
    ("bi-gate-lr0.1", "r2l"),
    ("bi", "bi-static"),
    ("bi-gate-lr0.1", "bi-static"),
    ("bi", "2×L2R"),
    ("bi-gate-lr0.1", "2×L2R"),
    ("r2l", "l2r"),
    ("bi-gate-lr0.1", "bi"),
)
STREAMS = ("l2r", "r2l")


def scorer_metrics(sets: dict[str, list[Trajectory]], s: dict[str, StepScores]) -> dict[str, np.ndarray]:
    """Per-question values of one scorer: the endpoints at its P1 threshold (chosen on validation to pass
    CLEAN_PASS of the clean rows), the primary endpoint of each stream of a two-stream model, σ at t."""
    valid, test = sets["valid"], sets["test"]
    clean = np.flatnonzero([t.meta["kind"] in "RC" for t in valid])
    q = endpoints(s["test"], test, clean_pass_threshold(s["valid"], clean))
    rows, t = rows_by_kind(test)
    if all(getattr(s["test"], k) is not None for k in STREAMS):
        for stream in STREAMS:
            q[f"{PRIMARY}, {stream} stream"] = below_every_clean_step(s["test"], rows["F"], rows["C"], t, stream)
    if s["test"].sigma is not None:
        for k in KINDS:
            q[f"σ at t, {k} rows"] = _at(s["test"], "sigma", rows[k], t)
    return q


def rule_scorers(sets: dict[str, list[Trajectory]]) -> dict[str, list[dict[str, StepScores]]]:
    """The scorers that read no model, on validation and test, as "runs" (noise: three seeds)."""
    valid, test, train = sets["valid"], sets["test"], sets["train"]
    n_steps = lambda trajs: np.array([len(x.steps) for x in trajs])  # noqa: E731
    k, _ = tune_flag_step(n_steps(valid), first_errors(valid))

    def both(score) -> dict[str, StepScores]:
        return {"valid": score(valid), "test": score(test)}

    return {
        "format rule: low at a non-final step without '='": [both(format_rule)],
        "rounder-number rule: trust a rounder result": [both(rounder_number_rule)],
        f"position: flag step {k} when there are more than {k} steps": [
            both(lambda x: position_rule(x, flag_step(n_steps(x), k)))
        ],
        "position: the most frequent error step for the step count": [
            both(lambda x: position_rule(x, most_frequent_step(train, x)))
        ],
        "chance: i.i.d. normal step scores": [both(lambda x, i=i: noise(x, 1106 + i)) for i in range(3)],
    }


def _stack(ms: list[dict[str, np.ndarray]], key: str) -> np.ndarray:
    return np.stack([m[key] for m in ms])


def _kept(values: np.ndarray) -> np.ndarray:
    return values[:, ~np.isnan(values).any(0)]  # questions whose step t every seed scored


def loss_floors(train: list[Trajectory]) -> dict[str, dict[str, float]]:
    """Each stream's reachable training loss (nats per step) under version 2's labels and, on the same rows, version
    1's."""
    v1 = [replace(x, labels=row_labels(x.meta["kind"], x.meta["step"], len(x.steps), "first-error")) for x in train]
    return {
        labels: {stream: round(loss_floor(rows, stream), 4) for stream in ("l2r", "r2l", "bi")}
        for labels, rows in (("version 2 (own)", train), ("version 1 (first error)", v1))
    }


def sigma_during_training(out: Path) -> dict[str, list[dict]]:
    """Per gated run, σ by position on validation as it trained (SigmaByPosition; the last line per step)."""
    found = {}
    for path in sorted((out / "runs").glob("*.sigma.jsonl")):
        lines = {(e := json.loads(line))["step"]: e for line in path.read_text().splitlines() if line.strip()}
        found[path.name.removesuffix(".sigma.jsonl")] = [lines[s] for s in sorted(lines)]
    return found


def summarise(cfg: MechanismConfig) -> dict:
    sets, pools, data = load_sets(cfg)
    groups = _collect(cfg)
    found = verdict_tables(cfg, sets, groups)
    transfer = {g: [run_metrics(sets, s) for _, s in runs] for g, runs in groups.items()}
    pb_table, pb_base = processbench_tables(sets, transfer)
    pilot = Path(cfg.out) / "pilot.json"
    return {
        "data": data,
        "groups": {g: [name for name, _ in runs] for g, runs in groups.items()},
        **found,
        "loss_floors": loss_floors(sets["train"]),
        "sigma_during_training": sigma_during_training(Path(cfg.out)),
        "pilot": json.loads(pilot.read_text()) if pilot.is_file() else None,
        "processbench": pb_table,
        "processbench_baselines": pb_base,
        "bon": bon_tables(pools, groups),
    }


def endpoint_tables(
    sets: dict[str, list[Trajectory]],
    groups: dict[str, list],
    arms: tuple[str, ...] = ARMS,
    pairs: tuple[tuple[str, str], ...] = DIFFERENCES,
    level: float = LEVEL,
) -> dict:
    """Per-question values of every run and rule ("metrics"), the endpoints table, σ at t of `arms`, and the paired
    differences `pairs` on VERDICT_ENDPOINTS at `level` (with their MDE). Versions 2 and 3 read their verdicts from
    these."""
    metrics = {g: [scorer_metrics(sets, s) for _, s in runs] for g, runs in groups.items()}
    rules = {name: [scorer_metrics(sets, s) for s in runs] for name, runs in rule_scorers(sets).items()}
    table = {
        g: {k: bootstrap_mean(100 * _kept(_stack(ms, k))) for k in ms[0] if not k.startswith("σ")}
        for g, ms in (metrics | rules).items()
    }
    for g in table:
        table[g]["seeds"] = len((metrics | rules)[g])
    rows, _ = rows_by_kind(sets["test"])
    table["chance: i.i.d. continuous scores, exactly"] = {
        PRIMARY: bootstrap_mean(100 * chance_below_every_clean_step([len(sets["test"][r].steps) for r in rows["F"]])),
        "seeds": 0,
    }
    sigma = {
        g: {k: bootstrap_mean(_kept(_stack(ms, k))) for k in ms[0] if k.startswith("σ")}
        for g, ms in metrics.items()
        if g in arms
    }
    differences: dict[str, dict] = {k: {} for k in (*VERDICT_ENDPOINTS, "σ at t")}
    for a, b in pairs:
        if a in metrics and b in metrics:
            for k in VERDICT_ENDPOINTS:
                differences[k][f"{a} − {b}"] = paired_difference(
                    100 * _stack(metrics[a], k), 100 * _stack(metrics[b], k), level=level
                )
                differences[k][f"{a} − {b}"]["mde"] = _mde(differences[k][f"{a} − {b}"], level)
    return {"metrics": metrics, "table": table, "sigma": sigma, "differences": differences}


def verdict_tables(cfg: MechanismConfig, sets: dict[str, list[Trajectory]], groups: dict[str, list]) -> dict:
    """The endpoints table, σ at t, the paired differences, the pre-registered verdict and the post-hoc re-read:
    everything that reads only the study's own rows (train, valid, test), not the transfer sets."""
    found = endpoint_tables(sets, groups)
    metrics, table, sigma, differences = found["metrics"], found["table"], found["sigma"], found["differences"]
    for arm in ARMS:
        if arm in metrics:
            gap = _kept(_stack(metrics[arm], "σ at t, L rows") - _stack(metrics[arm], "σ at t, F rows"))
            differences["σ at t"][f"{arm}: L rows − F rows"] = bootstrap_mean(gap, level=LEVEL)
    single = {s: table[s][PRIMARY]["mean"] for s in STREAMS if s in table}
    better = max(single, key=single.get) if single else "l2r"
    finished = {g: len(runs) for g, runs in groups.items()}
    result = verdict(differences, ARMS, better)
    short = [f"{g} {finished.get(g, 0)} of {n}" for g, n in cfg.seeds.items() if finished.get(g, 0) < n]
    if short and not result["missing"]:
        result["outcome"] += f" (provisional: seeds finished {', '.join(short)})"
    return {
        "table": table,
        "sigma": sigma,
        "differences": differences,
        "better_single_stream": better,
        "verdict": result,
        "post_hoc": reread(sets, groups, metrics, table, differences, better, Path(cfg.out)),
    }


def _mde(d: dict, level: float = LEVEL) -> float:
    """The smallest effect this difference's interval could detect at 80 % power (its standard error from its width)."""
    se = (d["high"] - d["low"]) / (2 * NormalDist().inv_cdf((1 + level) / 2))
    return minimum_detectable_effect(se, level)


def format_report(r: dict) -> str:
    cols = [
        *VERDICT_ENDPOINTS,
        "R rows: no error",
        "C rows: no error",
        "S1: C > F at t",
        "S1: R > L at t",
        f"{PRIMARY}, l2r stream",
        f"{PRIMARY}, r2l stream",
    ]
    rows = [[f"{g} ({v['seeds']})", *(_cell(v.get(c)) for c in cols)] for g, v in r["table"].items()]
    diff_rows = [
        [
            name,
            *(
                _cell(r["differences"][k].get(name))
                + (f" (MDE {r['differences'][k][name]['mde']:.1f})" if name in r["differences"][k] else "")
                for k in VERDICT_ENDPOINTS
            ),
        ]
        for name in dict.fromkeys(n for k in VERDICT_ENDPOINTS for n in r["differences"][k])
    ]
    sig_cols = [f"σ at t, {k} rows" for k in KINDS]
    sig_rows = [[g, *(_cell(v.get(c), 3) for c in sig_cols)] for g, v in r["sigma"].items()]
    sig_rows += [[name, _cell(v, 3), "", "", ""] for name, v in r["differences"]["σ at t"].items()]
    held = [[name, o] for name, o in r["verdict"]["predictions"].items()] + [
        [n, "not yet run"] for n in r["verdict"]["missing"]
    ]
    floors = [[labels, *(f"{v[s]:.3f}" for s in ("l2r", "r2l", "bi"))] for labels, v in r["loss_floors"].items()]
    pb_rows = [[g, _cell(v)] for g, v in r["processbench"].items()] + [
        [f"baseline: {n}", _cell(v)] for n, v in r["processbench_baselines"].items()
    ]
    md = [
        "# Mechanism study, version 2: labels each stream can fit, no text cue, a gate given a chance",
        f"Design, endpoints and verdict rule: studies/mechanism/README.md (committed before any run finished). "
        f"Verdict by the pre-registered rule: **{r['verdict']['outcome']}**.",
        "Runs: " + "; ".join(f"{g}: {', '.join(names)}" for g, names in r["groups"].items()) + ".",
        f"Pilot: {r['pilot']['decision'] if r['pilot'] else 'not yet decided'}.",
        f"Test: {r['data']['test']['questions']} GSM8K-test questions × 4 rows; validation: "
        f"{r['data']['valid']['questions']}; "
        f"training: {r['data']['train']['questions']}. Every cell: mean [95 % bootstrap interval over questions, seeds "
        "resampled]; (n) = seeds.",
        "## Reachable training loss (nats per step) from what each stream reads",
        markdown_table(["labels", "l2r", "r2l", "bi"], floors),
        "## Endpoints (%): every arm beside the scorers that read no model",
        markdown_table(["scorer (seeds)", *cols], rows),
        "![endpoints](endpoints.png)",
        f"### Paired differences (points; 97.5 % intervals; MDE = smallest effect detectable at 80 % power); "
        f"the better single stream on the primary endpoint: {r['better_single_stream']}",
        markdown_table(["difference", *VERDICT_ENDPOINTS], diff_rows),
        "## The gate at step t (σ = weight on L2R)",
        markdown_table(["arm", *sig_cols], sig_rows),
        "## The verdict rule, prediction by prediction (97.5 % intervals)",
        markdown_table(["prediction", "outcome"], held),
        "## T1: ProcessBench GSM8K, F1 at the validation threshold (%)",
        markdown_table(["model", "F1"], pb_rows),
        "## T2: Best-of-N on one-style sub-pools, random n-subsets, mean over n ∈ {2, 3} (%)",
    ]
    for style, b in r["bon"].items():
        aggs = list(b["by_aggregation"])
        names = list(b["by_aggregation"][aggs[0]])
        md += [
            f"**{style}**: {b['questions']} questions, {b['candidates']} candidates.",
            markdown_table(
                ["scorer", *aggs], [[n, *(_cell(b["by_aggregation"][a].get(n)) for a in aggs)] for n in names]
            ),
        ]
    if r["sigma_during_training"]:
        md += ["## σ by position on validation during training (first and last logged step)"]
        md += [
            markdown_table(
                ["run", "step", *(f"position {p:.1f}" for p in lines[0]["position"])],
                [
                    [run, str(e["step"]), *(("–" if m is None else f"{m:.3f}") for m in e["mean"])]
                    for e in (lines[0], lines[-1])
                ],
            )
            for run, lines in r["sigma_during_training"].items()
        ]
        md += ["![σ by position at the end of training](sigma_by_position.png)"]
    return "\n\n".join(md) + "\n"


def write_report(cfg: MechanismConfig) -> dict:
    out = check_meta(cfg)
    result = summarise(cfg)
    write_json(out / "results.json", result)
    reread = format_reread(result, result["verdict"])
    (out / "report.md").write_text(format_report(result) + "\n" + reread)
    plot_figures(result, out)
    print(reread)
    return result


def plot_figures(r: dict, out: Path) -> None:
    """The verdict's endpoints per scorer beside the rules that read no model, and each gated run's last σ curve."""
    panels = {k: {g: v[k] for g, v in r["table"].items() if k in v} for k in (*VERDICT_ENDPOINTS, "S1: C > F at t")}
    rules = tuple(g for g in r["table"] if g not in r["groups"])  # the scorers that read no model
    plot_intervals(
        str(out / "endpoints.png"),
        panels,
        "Mechanism v2, test: mean [95 % interval over seeds and questions]",
        muted=rules,
    )
    if r["sigma_during_training"]:
        plot_curves(
            str(out / "sigma_by_position.png"),
            {run: lines[-1] for run, lines in r["sigma_during_training"].items()},
            "σ (weight on L2R)",
            "Gate by step position, validation, end of training",
            hline=0.5,
            ylim=(0, 1),
        )
