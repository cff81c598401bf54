"""Version 3 of the mechanism study, as amended before any run (studies/mechanism/PREREGISTRATION_v3_amended.md): the
paper's own four predictions judged on its gate (plain `bi`) with symmetric margins, the low-lr gate beside it, the
L2R-readable-value covariate, σ by position without the templated answer line, each prediction's power, and its report,
computed from the saved logits alone. No verdict until every planned run is in.

Every number of the design (arms, seeds, margins, interval level, depth, precision) is read from the study's config
(studies/mechanism/v3_amended.yaml); what each prediction measures is fixed here (PREDICTIONS). The endpoints, the
σ contrasts, the format-aware null, R2L's share of the fused logit and the loss floors are version 2's code
(`v2_report.endpoint_tables`, `v2_reread`), called with version 3's arm, pairs and level.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from biprm.analysis.common import markdown_table
from biprm.data.trajectory import Trajectory
from biprm.evaluation.outputs import write_json
from biprm.metrics.bootstrap import bootstrap_mean, paired_difference
from studies.mechanism.config import MechanismConfig
from studies.replication.data import _value, _values
from studies.mechanism.rows import KINDS, load_sets
from studies.mechanism.report import _cell, _collect, check_meta, rows_by_kind
from studies.mechanism.v2_report import PRIMARY, VERDICT_ENDPOINTS, endpoint_tables
from studies.mechanism.v2_reread import (
    SIGMA_CONTRASTS,
    _interval,
    format_null,
    one_standard_floors,
    position_spans,
    power,
    template_steps,
    r2l_share,
    sigma_contrasts,
    spearman,
)
from biprm.scoring.step_scores import StepScores

P2 = VERDICT_ENDPOINTS[2]
SAME_FORMAT = SIGMA_CONTRASTS[2][0]  # σ(C) − σ(F) at t: the error, bare step in both rows
# The paper's own predictions, the only ones judged (their margins are the config's `margins[key]`): (statement,
# quantity). "arm" is the verdict arm.
PREDICTIONS = {
    "r2l_beats_l2r": ("R2L catches future-revealed errors better than L2R", "primary, r2l − l2r (points)"),
    "gate_beats_static": ("the gate beats the static average", "primary, arm − bi-static (points)"),
    "gate_beats_l2r": ("the paper's gate beats L2R", "primary, arm − l2r (points)"),
    "sigma_rises": (
        "σ rises with position, the answer line left out",
        "mean over seeds of Spearman(σ, k/(m−1)), test R rows without the answer line",
    ),
}
COVARIATE_ENDPOINTS = (*VERDICT_ENDPOINTS, "S1: C > F at t")


# ---- the verdict rule (pure) -------------------------------------------------------------------


def check_design(cfg: MechanismConfig) -> None:
    """Refuse a design whose predictions this code does not compute, before anything trains: the amended design
    (v3_amended.yaml, PREREGISTRATION_v3_amended.md) runs only once its verdict code is in."""
    if set(cfg.margins) != set(PREDICTIONS):
        raise ValueError(
            f"{cfg.out}: the design judges {', '.join(sorted(cfg.margins))}, and this code computes "
            f"{', '.join(PREDICTIONS)}: its verdict code must land before any of its runs"
        )


def judge(interval: dict, margin: float) -> str:
    """One prediction, its margin used the same way both sides: "held" when the interval's low end is above the
    margin, "contradicted" when its high end is below it, else "undecided"."""
    return "held" if interval["low"] > margin else "contradicted" if interval["high"] < margin else "undecided"


def verdict(intervals: dict[str, dict], margins: dict[str, float]) -> dict:
    """The amended rule: "supported" if every prediction holds, "contradicted" if any is contradicted, and otherwise
    "not decided at this power". `intervals[key]` holds {"low", "high"} (the config's level) for the PREDICTIONS keys
    measured so far; until every one is, the outcome is "not yet decidable"."""
    outcomes = {key: judge(intervals[key], margins[key]) for key in PREDICTIONS if key in intervals}
    missing = [key for key in PREDICTIONS if key not in intervals]
    if missing:
        outcome = "not yet decidable"
    elif all(o == "held" for o in outcomes.values()):
        outcome = "supported"
    elif "contradicted" in outcomes.values():
        outcome = "contradicted"
    else:
        outcome = "not decided at this power"
    return {"outcome": outcome, "predictions": outcomes, "missing": missing}


def prediction_power(
    intervals: dict[str, dict],
    margins: dict[str, float],
    power_at: dict[str, list[float]],
    level: float,
    scale: float = 1.0,
) -> dict[str, dict[str, float]]:
    """Per prediction and true value: the chance its interval (standard error times `scale`) lands on the true value's
    side of the margin (held above it, contradicted below). scale = √(3/20) on version 2's intervals is the design's
    power column."""
    return {
        key: {f"{true:+g}": power(intervals[key], margins[key], true, level, scale) for true in power_at.get(key, [])}
        for key in PREDICTIONS
        if key in intervals
    }


# ---- the covariate: can L2R read the right value from before step t? -----------------------------


def readable(traj: Trajectory) -> bool:
    """Whether the right value at step t (meta "from") is a + b, a − b, a × b or a ÷ b of two numbers (the same one
    twice allowed) written in the question or the steps before t: a value L2R could compute from what it has read."""
    right = _value(traj.meta["from"])
    numbers = sorted(set(_values(traj.question)).union(*map(_values, traj.steps[: traj.meta["step"]])))
    return any(right in (a + b, a - b, a * b) or (b != 0 and a / b == right) for a in numbers for b in numbers)


def covariate(test: list[Trajectory], metrics: dict[str, list[dict[str, np.ndarray]]], arm: str, level: float) -> dict:
    """Per question whether the value is readable (`readable`, on the R row), and on each half, per endpoint: every
    arm's mean, prediction 1's difference (arm − l2r) and the expectation's r2l − l2r, with intervals."""
    rows, _ = rows_by_kind(test)
    mask = np.array([readable(test[r]) for r in rows["R"]])
    halves = {"readable": mask, "not readable": ~mask}
    out: dict = {
        "readable_share": float(mask.mean()),
        "questions": {h: int(m.sum()) for h, m in halves.items()},
        "endpoints": {},
    }
    for endpoint in COVARIATE_ENDPOINTS if metrics else ():
        stacked = {g: 100 * np.stack([m[endpoint] for m in ms]) for g, ms in metrics.items()}
        found = {}
        for half, m in halves.items():
            if not m.any():
                continue
            keep = m & ~np.isnan(np.concatenate(list(stacked.values()))).any(0)
            found[half] = {g: bootstrap_mean(v[:, keep], level=level) for g, v in stacked.items()}
            for a, b in ((arm, "l2r"), ("r2l", "l2r")):
                if a in stacked and b in stacked:
                    found[half][f"{a} − {b}"] = paired_difference(stacked[a][:, keep], stacked[b][:, keep], level=level)
        out["endpoints"][endpoint] = found
    return out


# ---- the paper's σ claim, with an interval --------------------------------------------------------


def sigma_rises(
    runs: list[StepScores],
    rows: np.ndarray,
    level: float,
    resamples: int = 2000,
    seed: int = 0,
    keep: np.ndarray | None = None,
) -> dict:
    """The mean over runs (seeds) of Spearman(σ, k/(n−1)) over every step of `rows` (one per question) that `keep`
    keeps (`position_spans`; rows of one step left out), with a percentile interval that resamples questions and seeds
    together, as `bootstrap_mean` does."""
    spans, position = position_spans(runs[0].offsets, rows, keep)

    def per_run(index: np.ndarray) -> np.ndarray:
        steps = np.concatenate([spans[q] for q in index])
        return np.array([spearman(position[steps], s.sigma[steps]) for s in runs])

    rng = np.random.default_rng(seed)
    means = []
    for _ in range(resamples):
        values = per_run(rng.integers(len(spans), size=len(spans)))
        means.append(values[rng.integers(len(runs), size=len(runs))].mean())
    each = per_run(np.arange(len(spans)))
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(each.mean()), "low": float(low), "high": float(high), "per_run": each.tolist()}


# ---- which runs the verdict reads -----------------------------------------------------------------


def verdict_runs(cfg: MechanismConfig, groups: dict[str, list]) -> dict:
    """The runs the verdict reads: those on the study's one machine and precision (its first finished run's, in run
    order), on complete sets of seeds (every arm has the seed); the rest are listed apart. No 2×L2R in version 3."""
    from studies.mechanism.study import runs_of  # here: study imports this module

    out = Path(cfg.out)
    recorded = {
        r.name: json.loads(p.read_text()) for r in runs_of(cfg) if (p := out / "runs" / f"{r.name}.json").is_file()
    }
    machine = next(({"device": v["device"], "bf16": v["bf16"]} for v in recorded.values()), None)
    apart = {
        n: {"device": v["device"], "bf16": v["bf16"]}
        for n, v in recorded.items()
        if {"device": v["device"], "bf16": v["bf16"]} != machine
    }
    seed_of = {n: v["seed"] for n, v in recorded.items()}
    on = {g: [(n, s) for n, s in groups.get(g, []) if n in seed_of and n not in apart] for g in cfg.seeds}
    complete = sorted(set.intersection(*({seed_of[n] for n, _ in runs} for runs in on.values()))) if on else []
    kept = {g: [(n, s) for n, s in runs if seed_of[n] in complete] for g, runs in on.items()}
    short = [f"{g} {len(on[g])} of {n}" for g, n in cfg.seeds.items() if len(on[g]) < n]
    return {
        "groups": {g: runs for g, runs in kept.items() if runs},
        "machine": machine,
        "apart": apart,
        "seeds": complete,
        "provisional": short,
    }


# ---- the report --------------------------------------------------------------------------------------


def gated_arms(cfg: MechanismConfig) -> tuple[str, ...]:
    """The verdict arm first, then every other gated arm of the design (reported beside it through the same code)."""
    beside = [g for g in cfg.seeds if g.startswith("bi") and g not in (cfg.verdict_arm, "bi-static")]
    return (cfg.verdict_arm, *beside)


def prediction_intervals(arm: str, differences: dict, sigma: dict | None) -> dict[str, dict]:
    """Each PREDICTIONS key's interval for one gated arm, where measured."""
    found = {
        "r2l_beats_l2r": differences[PRIMARY].get("r2l − l2r"),
        "gate_beats_static": differences[PRIMARY].get(f"{arm} − bi-static"),
        "gate_beats_l2r": differences[PRIMARY].get(f"{arm} − l2r"),
        "sigma_rises": sigma,
    }
    return {key: d for key, d in found.items() if d is not None}


def summarise(cfg: MechanismConfig) -> dict:
    sets, _, data = load_sets(cfg)
    chosen = verdict_runs(cfg, _collect(cfg))
    groups, arm, level = chosen["groups"], cfg.verdict_arm, cfg.level
    arms = gated_arms(cfg)
    pairs = (("r2l", "l2r"), ("bi-static", "l2r"), *((a, b) for a in arms for b in ("l2r", "bi-static", "r2l")))
    found = endpoint_tables(sets, groups, arms=arms, level=level, pairs=pairs)
    metrics, differences = found.pop("metrics"), found["differences"]
    test = sets["test"]
    rows, t = rows_by_kind(test)
    answer_line = template_steps(test)
    sigma = {
        a: {
            "without the answer line": sigma_rises(runs, rows["R"], level, keep=~answer_line),
            "with it": sigma_rises(runs, rows["R"], level),
        }
        for a in arms
        if (runs := [s["test"] for _, s in groups.get(a, [])])
    }
    each = {a: prediction_intervals(a, differences, sigma.get(a, {}).get("without the answer line")) for a in arms}
    result = verdict(each[arm], cfg.margins)
    if chosen["provisional"]:  # no verdict on part of the runs
        result["outcome"] = f"not yet decidable: runs in {', '.join(chosen['provisional'])}"
    runs_of_arm = {n: s["test"] for n, s in groups.get(arm, [])}
    return {
        "data": data,
        "design": {
            k: getattr(cfg, k)
            for k in ("seeds", "first_seed", "verdict_arm", "level", "margins", "top_layers", "bf16", "device")
        },
        "machine": chosen["machine"],
        "apart": chosen["apart"],
        "seeds": chosen["seeds"],
        "groups": {g: [n for n, _ in runs] for g, runs in groups.items()},
        **found,
        "verdict": result,
        "intervals": each[arm],
        "beside": {a: {"intervals": each[a], **verdict(each[a], cfg.margins)} for a in arms[1:]},
        "power": prediction_power(each[arm], cfg.margins, cfg.power_at or {}, level),
        "sigma_rises": sigma,
        "sigma_contrasts": sigma_contrasts(metrics, arms, level),
        "format_null": bootstrap_mean(100 * format_null(test)[None]),
        "r2l_share_at_t": {n: {k: r2l_share(s, rows[k], t) for k in KINDS} for n, s in runs_of_arm.items()},
        "covariate": covariate(test, metrics, arm, level),
        "loss_floors": one_standard_floors(sets["train"]),
    }


def format_report(r: dict) -> str:
    arm, margins, v = r["design"]["verdict_arm"], r["design"]["margins"], r["verdict"]

    def rows_of(found: dict, judged: dict) -> list[list[str]]:
        return [
            [
                f"{i + 1}. {text}",
                quantity,
                _cell(found.get(key), 3 if key == "sigma_rises" else 1),
                f"{margins[key]:+g}",
                judged.get(key, "not yet measured"),
            ]
            for i, (key, (text, quantity)) in enumerate(PREDICTIONS.items())
        ]

    predictions = [
        [*row, ", ".join(f"{100 * p:.0f} % at {true}" for true, p in r["power"].get(key, {}).items()) or "–"]
        for row, key in zip(rows_of(r["intervals"], v["predictions"]), PREDICTIONS)
    ]
    beside = [[a, *row] for a, b in r["beside"].items() for row in rows_of(b["intervals"], b["predictions"])]
    sigma = [
        [a, reading, _cell(x, 3), ", ".join(f"{y:+.3f}" for y in x["per_run"])]
        for a, readings in r["sigma_rises"].items()
        for reading, x in readings.items()
    ]
    cols = [*VERDICT_ENDPOINTS, "R rows: no error", "C rows: no error", "S1: C > F at t", "S1: R > L at t"]
    table = [[f"{g} ({x['seeds']})", *(_cell(x.get(c)) for c in cols)] for g, x in r["table"].items()]
    table.append(
        [
            "format rule, ties broken at random (the primary endpoint's null)",
            _cell(r["format_null"]),
            *[""] * (len(cols) - 1),
        ]
    )
    diffs = [
        [name, *(_cell(r["differences"][k].get(name)) for k in VERDICT_ENDPOINTS)]
        for name in dict.fromkeys(n for k in VERDICT_ENDPOINTS for n in r["differences"][k])
    ]
    share = [[n, *(f"{x[k]:.3f}" for k in KINDS)] for n, x in r["r2l_share_at_t"].items()]
    floors = r["loss_floors"]
    cov = r["covariate"]
    cov_rows = [
        [endpoint, half, *(_cell(found[half].get(name)) for name in (arm, "l2r", "r2l", f"{arm} − l2r", "r2l − l2r"))]
        for endpoint, found in cov["endpoints"].items()
        for half in found
    ]
    machine = r["machine"] or {"device": "–", "bf16": "–"}
    md = [
        "# Mechanism study, version 3 as amended: the paper's own predictions, its gate, symmetric margins",
        "Design, margins and verdict rule: studies/mechanism/PREREGISTRATION_v3_amended.md (committed before any run); "
        f"every number from studies/mechanism/v3_amended.yaml. Verdict ({arm}, the paper's gate): **{v['outcome']}**.",
        f"Machine: {machine['device']}, bf16 {machine['bf16']}; complete seeds read: {len(r['seeds'])} "
        f"({', '.join(map(str, r['seeds'])) or 'none'}). Runs on another machine or precision, apart: "
        + (", ".join(f"{n} ({x['device']}, bf16 {x['bf16']})" for n, x in r["apart"].items()) or "none")
        + ".",
        f"Test: {r['data']['test']['questions']} GSM8K-test questions × 4 rows. Intervals: "
        f"{100 * r['design']['level']:g} % over "
        "seeds and questions for the predictions and differences, 95 % for the endpoints table.",
        "## The judged predictions (the paper's own)",
        markdown_table(
            ["prediction", "quantity", "interval", "margin", "outcome", "power at this interval"], predictions
        ),
        "## The same, for the other gated arms (reported, not judged)",
        markdown_table(["arm", "prediction", "quantity", "interval", "margin", "outcome"], beside),
        "## σ by position (test R rows), with and without the answer line",
        markdown_table(["arm", "reading", "mean Spearman over seeds", "per seed"], sigma),
        "## Endpoints (%), every arm beside the scorers that read no model",
        markdown_table(["scorer (seeds)", *cols], table),
        "## Paired differences (points)",
        markdown_table(["difference", *VERDICT_ENDPOINTS], diffs),
        "## σ at t: contrasts by format (reported, not judged)",
        markdown_table(
            ["contrast", *r["sigma_contrasts"]],
            [
                [name, *(_interval(c[name], 4) for c in r["sigma_contrasts"].values())]
                for name in next(iter(r["sigma_contrasts"].values()), {})
            ],
        ),
        "## R2L's effective share of the fused logit at t, by row kind (|(1 − σ)·r2l| / (|σ·l2r| + |(1 − σ)·r2l|))",
        markdown_table(["run", *KINDS], share),
        "## Covariate: is the right value at t one operation from earlier numbers (readable by L2R)?",
        f"Readable: {100 * cov['readable_share']:.1f} % of test questions ({cov['questions']['readable']} readable, "
        f"{cov['questions']['not readable']} not). Pre-registered expectation (not a verdict prediction): r2l − l2r is "
        "larger where the value is not readable.",
        markdown_table(["endpoint", "half", arm, "l2r", "r2l", f"{arm} − l2r", "r2l − l2r"], cov_rows, left=2),
        "## Loss floors (nats per step), under both standards",
        markdown_table(
            ["standard", "l2r", "r2l"],
            [[k, f"{floors[k]['l2r']:.3f}", f"{floors[k]['r2l']:.3f}"] for k in ("pre-registered", "one standard")],
        ),
    ]
    return "\n\n".join(md) + "\n"


def write_report(cfg: MechanismConfig) -> dict:
    out = check_meta(cfg)
    result = summarise(cfg)
    write_json(out / "results.json", result)
    report = format_report(result)
    (out / "report.md").write_text(report)
    print(report)
    return result
