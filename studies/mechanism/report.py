"""The mechanism study's report, computed from the per-item logits each run saved (OUT/runs/RUN.npz).

Nothing here trains or scores, so the report can be redone, or extended, at any time
(`python -m studies.mechanism --config studies/mechanism/v1.yaml --report-only`). It computes the endpoints written
in studies/mechanism/README.md before the runs, each beside the content-free baselines that apply,
with 95 % bootstrap intervals over test questions (seeds resampled too), and applies the
pre-registered verdict rule to them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from biprm.scoring.aggregate import mean_of_probabilities
from biprm.analysis.common import first_errors, markdown_table
from biprm.analysis.plots import plot_curves, position_curve
from biprm.data.trajectory import Trajectory
from biprm.evaluation.bon import bon_rows
from biprm.evaluation.outputs import fmt, write_json
from biprm.data.benchmarks import SUBPOOLS
from biprm.evaluation.pools import Pool
from biprm.evaluation.processbench import flag_step_rule, out_of_sample, tuned_threshold
from biprm.metrics.bootstrap import bootstrap_mean, bootstrap_statistic, paired_difference
from biprm.metrics.first_error import flag_step, predict_first_error, processbench_scores, tune_flag_step
from biprm.metrics.ranking import auc, paired_win
from studies.mechanism.config import MechanismConfig
from studies.mechanism.rows import KINDS, load_sets, scores_path
from biprm.scoring.step_scores import StepScores, load_scores

GROUPS = (
    "l2r",
    "r2l",
    "bi-static",
    "bi",
    "bi-gate-lr0.1",
    "2×L2R",
    "probe-l2r",
    "probe-r2l",
    "probe-bi-static",
    "probe-bi",
)
BON_NS = (2, 3)
BON_AGGS = ("min", "mean", "last")
ENDPOINTS = ("P1: F rows, first error exact", "P2: L rows, first error exact")
# P1 and P2 with the columns that read them: where the F rows' flags fall, and how often clean rows pass.
# "flagged before t", "not flagged" and "lowest step is t" were added after the first seed's report, as
# diagnostics of where P1's misses go; they decide nothing.
FIRST_ERROR_COLUMNS = (
    "P1: F rows, first error exact",
    "F rows flagged before t",
    "F rows flagged one step late",
    "F rows not flagged",
    "F rows: lowest step is t (no threshold)",
    "P2: L rows, first error exact",
    "R rows: no error",
    "C rows: no error",
)
DIFFERENCES = (
    ("bi", "l2r"),
    ("r2l", "l2r"),
    ("bi", "2×L2R"),
    ("bi-static", "l2r"),
    ("bi", "r2l"),
    ("probe-r2l", "probe-l2r"),
)


def rows_by_kind(trajs: list[Trajectory]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """({kind: row indices}, step t per question), aligned by question (the builder writes R, C, F, L per question)."""
    kinds = np.array([t.meta["kind"] for t in trajs])
    rows = {k: np.flatnonzero(kinds == k) for k in KINDS}
    steps = np.array([t.meta["step"] for t in trajs])
    if len({len(r) for r in rows.values()}) != 1 or not all(
        np.array_equal(steps[rows["R"]], steps[rows[k]]) for k in KINDS
    ):
        raise ValueError("the rows are not in R, C, F, L quadruples")
    return rows, steps[rows["F"]]


def _at(s: StepScores, stream: str, rows: np.ndarray, step: np.ndarray) -> np.ndarray:
    values = s.sigma if stream == "sigma" else s.prob(stream)
    scored = np.diff(s.offsets)[rows]
    return np.where(step < scored, values[s.offsets[rows] + np.minimum(step, scored - 1)], np.nan)


def _streams(s: StepScores) -> list[str]:
    return ["fused"] + [k for k in ("l2r", "r2l") if getattr(s, k) is not None]


def first_error_columns(
    pred: dict[str, np.ndarray], t: np.ndarray, lowest: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """FIRST_ERROR_COLUMNS per question, from the predicted first error of each row kind (-1: none) and the
    F rows' lowest-scored step (a rule that reads no text has one guess, its prediction)."""
    f = pred["F"]
    lowest = f if lowest is None else lowest
    return {
        "P1: F rows, first error exact": f == t,
        "F rows flagged before t": (f >= 0) & (f < t),
        "F rows flagged one step late": f == t + 1,
        "F rows not flagged": f == -1,
        "F rows: lowest step is t (no threshold)": lowest == t,
        "P2: L rows, first error exact": pred["L"] == t,
        "R rows: no error": pred["R"] == -1,
        "C rows: no error": pred["C"] == -1,
    }


def run_metrics(sets: dict[str, list[Trajectory]], s: dict[str, StepScores]) -> dict:
    """Per-question arrays ("questions") and per-run values ("values") of one model."""
    test, valid = sets["test"], sets["valid"]
    rows, t = rows_by_kind(test)
    threshold, _ = tuned_threshold(valid, s["valid"])
    pred = predict_first_error(s["test"].prob(), s["test"].offsets, threshold)
    prob, offsets = s["test"].prob(), s["test"].offsets
    lowest = np.array([np.argmin(prob[offsets[r] : offsets[r + 1]]) for r in rows["F"]])
    q = first_error_columns({k: pred[rows[k]] for k in KINDS}, t, lowest)
    for stream in _streams(s["test"]):
        at = {k: _at(s["test"], stream, rows[k], t) for k in KINDS}
        q[f"S1 C > F at t ({stream})"] = paired_win(at["C"], at["F"])
        q[f"S1 R > L at t ({stream})"] = paired_win(at["R"], at["L"])
    if s["test"].sigma is not None:
        for k in KINDS:
            q[f"σ at t, {k} rows"] = _at(s["test"], "sigma", rows[k], t)
    pb_trajs = sets["processbench"]
    pb = out_of_sample(pb_trajs, s["processbench"], dev=(valid, s["valid"]))
    values = {
        "threshold": threshold,
        "processbench": pb,
        "solution_min": s["test"].solution_logits("min"),
        "valid_solution_min": s["valid"].solution_logits("min"),
        "pb_pred": predict_first_error(s["processbench"].prob(), s["processbench"].offsets, pb["threshold"]),
    }
    if s["test"].sigma is not None:
        values["sigma_curve"] = position_curve(s["test"].sigma, s["test"].offsets, 5)
    return {"questions": {k: np.asarray(v, dtype=np.float64) for k, v in q.items()}, "values": values}


def _clean_mask(trajs: list[Trajectory]) -> np.ndarray:
    return np.array([t.meta["kind"] in "RC" for t in trajs])


def separation(solutions: list[np.ndarray], trajs: list[Trajectory], resamples: int = 300) -> dict:
    """S2: AUC (%) of the solution score, clean rows (R, C) against corrupted ones (F, L), averaged over
    the models in `solutions`, with an interval from resampling whole questions (4 rows each)."""
    clean = _clean_mask(trajs)

    def stat(idx: np.ndarray) -> float:
        pick = (idx[:, None] * 4 + np.arange(4)).ravel()
        return float(np.mean([auc(v[pick][clean[pick]], v[pick][~clean[pick]]) for v in solutions]))

    return bootstrap_statistic(stat, len(trajs) // 4, resamples)


def _ensemble(scores: list[dict[str, StepScores]]) -> dict[str, StepScores]:
    """The paper's 2×L2R: the mean probability of two l2r models, step by step."""
    out = {}
    for name, first in scores[0].items():
        fused = mean_of_probabilities([s[name].fused for s in scores])
        out[name] = StepScores(first.offsets, fused, l2r=fused)
    return out


def most_frequent_step(train: list[Trajectory], trajs: list[Trajectory]) -> np.ndarray:
    """Per row, the error step most frequent among the training F rows with its step count (a rule that reads no
    text)."""
    by_length: dict[int, Counter] = {}
    for x in train:
        if x.meta["kind"] == "F":
            by_length.setdefault(len(x.steps), Counter())[x.meta["step"]] += 1
    overall = sum(by_length.values(), Counter()).most_common(1)[0][0]
    return np.array(
        [by_length[len(t.steps)].most_common(1)[0][0] if len(t.steps) in by_length else overall for t in trajs]
    )


def baselines(sets: dict[str, list[Trajectory]]) -> dict[str, dict[str, np.ndarray]]:
    """Per-question values of the rules that read no text, on the test F and L rows."""
    test = sets["test"]
    rows, t = rows_by_kind(test)
    n_steps = np.array([len(x.steps) for x in test])[rows["F"]]
    valid = sets["valid"]
    k, _ = tune_flag_step(np.array([len(x.steps) for x in valid]), first_errors(valid))
    prior = most_frequent_step(sets["train"], [test[r] for r in rows["F"]])
    rules = {
        f"flag step k when there are more than k steps (k = {k}, tuned on validation)": flag_step(n_steps, k),
        "most frequent error step for the step count (fitted on training rows)": prior,
        "always 'no error'": np.full(len(t), -1),
    }
    # the four rows of a question have the same step count, so a rule that reads no text flags them alike
    return {name: first_error_columns(dict.fromkeys(KINDS, pred), t) for name, pred in rules.items()}


def _collect(cfg: MechanismConfig) -> dict[str, list[tuple[str, dict[str, StepScores]]]]:
    """Finished runs by group ("l2r", "probe-bi", ...), each a (name, scores) list in seed order."""
    groups: dict[str, list] = {}
    for path in sorted((Path(cfg.out) / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        npz = scores_path(cfg, run["run"])
        if npz.is_file():
            key = ("probe-" if run["heads_only"] else "") + run["mode"]
            groups.setdefault(key, []).append((run["run"], load_scores(npz)))
    l2r = groups.get("l2r", [])
    # version 1: l2r seeds 1106 + 1107; version 2: each l2r seed with the next, round the circle, as three seeds
    pairs = [(0, 1)] if cfg.version == 1 or len(l2r) == 2 else [(i, (i + 1) % len(l2r)) for i in range(len(l2r))]
    if len(l2r) >= 2:
        groups["2×L2R"] = [(f"{l2r[i][0]} + {l2r[j][0]}", _ensemble([l2r[i][1], l2r[j][1]])) for i, j in pairs]
    return {g: groups[g] for g in GROUPS if g in groups}


def _stack(metrics: list[dict], key: str) -> np.ndarray:
    return np.stack([m["questions"][key] for m in metrics])


def _interval(values: np.ndarray, scale: float = 100.0) -> dict:
    keep = ~np.isnan(values).any(0)  # questions whose step t was scored by every seed
    return bootstrap_mean(scale * values[:, keep])


def _cell(s: dict | None, digits: int = 1) -> str:
    return "–" if s is None else f"{fmt(s['mean'], digits)} [{fmt(s['low'], digits)}, {fmt(s['high'], digits)}]"


def summarise(cfg: MechanismConfig) -> dict:
    sets, pools, data = load_sets(cfg)
    groups = _collect(cfg)
    metrics = {g: [run_metrics(sets, s) for _, s in runs] for g, runs in groups.items()}
    diffs = differences(metrics)
    pb_table, pb_base = processbench_tables(sets, metrics)
    return {
        "data": data,
        "groups": {g: [name for name, _ in runs] for g, runs in groups.items()},
        **first_error_tables(sets, metrics),
        "differences": diffs,
        **stream_tables(metrics),
        **auc_tables(sets, metrics),
        "processbench": pb_table,
        "processbench_baselines": pb_base,
        "bon": bon_tables(pools, groups),
        "verdict": verdict(diffs, {g: len(runs) for g, runs in groups.items()}, cfg.seeds),
    }


def first_error_tables(sets: dict[str, list[Trajectory]], metrics: dict[str, list[dict]]) -> dict:
    """The first-error endpoints per group, seeds pooled, beside the content-free rules."""
    table = {
        g: {k: _interval(_stack(ms, k)) for k in FIRST_ERROR_COLUMNS}
        | {"seeds": len(ms), "threshold": float(np.mean([m["values"]["threshold"] for m in ms]))}
        for g, ms in metrics.items()
    }
    base = {name: {k: _interval(v[k][None].astype(float)) for k in v} for name, v in baselines(sets).items()}
    return {"first_error": table, "first_error_baselines": base}


def differences(metrics: dict[str, list[dict]]) -> dict:
    """The pre-registered paired differences (DIFFERENCES) on the endpoints the verdict reads, where both groups ran."""
    return {
        f"{a} − {b}": {
            k: paired_difference(100 * _stack(metrics[a], k), 100 * _stack(metrics[b], k)) for k in ENDPOINTS
        }
        for a, b in DIFFERENCES
        if a in metrics and b in metrics
    }


def stream_tables(metrics: dict[str, list[dict]]) -> dict:
    """S1 per group, and the gate's σ (table and curve) of the groups whose gate learns."""
    s1 = {
        g: {k: _interval(_stack(ms, k)) for k in ms[0]["questions"] if k.startswith("S1")} for g, ms in metrics.items()
    }
    sigma = {
        g: {k: _interval(_stack(ms, k), 1.0) for k in ms[0]["questions"] if k.startswith("σ")}
        for g, ms in metrics.items()
        if any(k.startswith("σ") for k in ms[0]["questions"]) and not g.endswith("bi-static")
    }  # bi-static's σ is 0.5 by design
    curves = {g: ms[0]["values"]["sigma_curve"] for g, ms in metrics.items() if "sigma_curve" in ms[0]["values"]}
    return {"s1": s1, "sigma": sigma, "sigma_curves": curves}


def auc_tables(sets: dict[str, list[Trajectory]], metrics: dict[str, list[dict]]) -> dict:
    """S2: clean-vs-corrupt AUC, resampling whole questions (4 rows each) with the seeds averaged."""
    test, valid = sets["test"], sets["valid"]
    auc = {
        g: {
            "test": separation([m["values"]["solution_min"] for m in ms], test),
            "valid": separation([m["values"]["valid_solution_min"] for m in ms], valid),
        }
        for g, ms in metrics.items()
    }
    lengths = np.array([len("\n".join(t.steps)) for t in test], dtype=float)
    return {"auc": auc, "auc_baselines": {"shorter text is cleaner": separation([-lengths], test)}}


def processbench_tables(sets: dict[str, list[Trajectory]], metrics: dict[str, list[dict]]) -> tuple[dict, dict]:
    """T1: ProcessBench GSM8K F1 at each run's validation threshold, and the rules that read no text."""
    pb_trajs, valid = sets["processbench"], sets["valid"]
    label = first_errors(pb_trajs)

    def f1_of(preds: list[np.ndarray]) -> dict:
        return bootstrap_statistic(
            lambda idx: float(np.nanmean([processbench_scores(p[idx], label[idx])["f1"] for p in preds])),
            len(label),
            resamples=300,
        )

    pb_table = {g: f1_of([m["values"]["pb_pred"] for m in ms]) for g, ms in metrics.items()}
    n_steps = np.array([len(t.steps) for t in pb_trajs])
    k = flag_step_rule(pb_trajs, valid)["k"]
    pb_base = {
        "always 'no error'": f1_of([np.full(len(label), -1)]),
        "always step 0": f1_of([np.zeros(len(label), dtype=np.int64)]),
        f"flag step k when there are more than k steps (k = {k}, tuned on validation)": f1_of([flag_step(n_steps, k)]),
    }
    return pb_table, pb_base


def bon_tables(pools: dict[str, Pool], groups: dict[str, list]) -> dict:
    """T2: Best-of-N on the one-style sub-pools, random n-subsets, beside the scorers that read no text."""
    bon = {}
    all_pool = pools["all"]
    cand = np.array([t.meta["cand"] for t in all_pool.trajs])
    for style in SUBPOOLS:
        pool: Pool = pools[style]
        idx = np.flatnonzero(np.isin(cand, SUBPOOLS[style]))
        per_style = {}
        for how in BON_AGGS:
            rows_by_group = {}
            for g, runs in groups.items():
                per_seed = [bon_rows(pool, {g: s["bon"].select(idx)}, how, BON_NS, "random", draws=50) for _, s in runs]
                rows_by_group[g] = np.stack([np.mean([r[g][n] for n in BON_NS], axis=0) for r in per_seed])
            free = bon_rows(pool, {}, how, BON_NS, "random", draws=50)
            rows_by_group |= {
                name.replace(f"noise + {how}", "noise under the same aggregation"): np.mean(
                    [v[n] for n in BON_NS], axis=0
                )[None]
                for name, v in free.items()
            }
            per_style[how] = {name: bootstrap_mean(100 * v) for name, v in rows_by_group.items()}
            if "bi" in rows_by_group and "l2r" in rows_by_group:
                per_style[how]["bi − l2r"] = paired_difference(100 * rows_by_group["bi"], 100 * rows_by_group["l2r"])
        bon[style] = {
            "questions": int(len(np.unique(pool.qid))),
            "candidates": len(pool.trajs),
            "by_aggregation": per_style,
        }
    return bon


def verdict(diffs: dict, finished: dict[str, int], planned: dict[str, int]) -> str:
    """The pre-registered rule (studies/mechanism/README.md) applied to the P1 and P2 differences; until every
    planned seed of l2r, r2l and bi has finished, the rule's outcome is only provisional."""
    need = ("bi − l2r", "r2l − l2r")
    if not all(d in diffs for d in need):
        return "not yet decidable: the runs for bi, r2l and l2r have not all finished"
    p1 = [diffs[d]["P1: F rows, first error exact"] for d in need]
    p2 = diffs["bi − l2r"]["P2: L rows, first error exact"]
    outcome = "supported" if all(d["low"] > 0 for d in p1) and p2["high"] >= 0 else "not supported"
    missing = [
        f"{m} {finished.get(m, 0)} of {planned[m]}"
        for m in ("l2r", "r2l", "bi")
        if finished.get(m, 0) < planned.get(m, 0)
    ]
    return f"{outcome} (provisional: seeds finished {', '.join(missing)})" if missing else outcome


def format_report(r: dict) -> str:
    groups = r["groups"]
    cols = list(FIRST_ERROR_COLUMNS)
    fe = [
        [
            f"{g} ({r['first_error'][g]['seeds']})",
            *(_cell(r["first_error"][g][c]) for c in cols),
            f"{r['first_error'][g]['threshold']:.3f}",
        ]
        for g in groups
    ]
    fe += [[f"baseline: {name}", *(_cell(v[c]) for c in cols), "–"] for name, v in r["first_error_baselines"].items()]
    diff_rows = [
        [name, *(_cell(d[c]) + (" (within noise)" if d[c]["within_noise"] else "") for c in ENDPOINTS)]
        for name, d in r["differences"].items()
    ]
    s1_cols = sorted({c for v in r["s1"].values() for c in v})
    s1_rows = [[g, *(_cell(r["s1"][g].get(c)) for c in s1_cols)] for g in groups]
    s1_rows.append(["any scorer that reads no text", *("50.0" for _ in s1_cols)])
    sig_cols = [f"σ at t, {k} rows" for k in KINDS]
    sig_rows = [[g, *(_cell(r["sigma"][g][c], 3) for c in sig_cols)] for g in r["sigma"]]
    auc_rows = [[g, _cell(v["valid"]), _cell(v["test"])] for g, v in r["auc"].items()]
    auc_rows += [[f"baseline: {name}", "–", _cell(v)] for name, v in r["auc_baselines"].items()]
    pb_rows = [[g, _cell(v)] for g, v in r["processbench"].items()] + [
        [f"baseline: {n}", _cell(v)] for n, v in r["processbench_baselines"].items()
    ]
    md = [
        "# Mechanism study: future-only errors (F) and local errors (L)",
        "Endpoints and design: studies/mechanism/README.md (written before the runs). Verdict by the pre-registered "
        f"rule: **{r['verdict']}**.",
        "Runs: " + "; ".join(f"{g}: {', '.join(names)}" for g, names in groups.items()) + ".",
        f"Test: {r['data']['test']['questions']} GSM8K-test questions × 4 rows; validation: "
        f"{r['data']['valid']['questions']} questions; training: {r['data']['train']['questions']} questions. Every "
        "cell: mean over seeds and questions [95 % bootstrap interval over questions, seeds resampled]; (n) = seeds.",
        "## P1, P2: first-error exact match at the validation threshold (%)",
        markdown_table(["model (seeds)", *cols, "threshold"], fe),
        "### Paired differences (points)",
        markdown_table(["difference", *ENDPOINTS], diff_rows),
        "## S1: paired discrimination at step t (% of questions; ties half)",
        markdown_table(["model", *s1_cols], s1_rows),
        "## S2: clean (R, C) vs corrupted (F, L) AUC of the min solution score (%)",
        markdown_table(["model", "validation", "test"], auc_rows),
    ]
    if sig_rows:
        md += [
            "## S3: the gate at step t (σ = weight on L2R)",
            markdown_table(["model", *sig_cols], sig_rows),
            "![σ by position](sigma_by_position.png)",
        ]
    md += [
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
    return "\n\n".join(md) + "\n"


def check_meta(cfg: MechanismConfig) -> Path:
    """The study's output folder, once a run has written what every report reads."""
    out = Path(cfg.out)
    if not (out / "meta.json").is_file():
        raise FileNotFoundError(
            f"{out}/meta.json not found: run `python -m studies.mechanism --config "
            f"studies/mechanism/v{cfg.version}.yaml` first"
        )
    return out


def write_report(cfg: MechanismConfig) -> dict:
    """Version 1's report (version 2's is `v2_report.write_report`, which builds on this module's tables)."""
    out = check_meta(cfg)
    result = summarise(cfg)
    if result["sigma_curves"]:
        plot_curves(
            str(out / "sigma_by_position.png"),
            result["sigma_curves"],
            "σ (weight on L2R)",
            "Gate by normalised step position (test rows, first seed)",
            hline=0.5,
            ylim=(0, 1),
        )
    write_json(out / "results.json", result)
    (out / "report.md").write_text(text := format_report(result))
    print(f"{text}\nwrote {out / 'report.md'} and {out / 'results.json'}")
    return result
