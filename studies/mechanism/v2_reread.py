"""Version 2's post-hoc re-read (studies/mechanism/README.md, "Version 2: the post-hoc re-read"), from the saved logits
alone.

Not pre-registered: the pre-registered rule's outcome stays on record beside it. Each piece answers one way the
pre-registered reading went further than its numbers:
- prediction 5 compared a bare step (F) with a worked one (L): the same-format contrasts σ(R) − σ(C) (the format
  shift alone), σ(C) − σ(F) (the error, bare in both), their difference-in-differences, and `verdict()` re-run with
  each in its place, or without prediction 5;
- the paper claims σ rises with position, not that it routes by error type: Spearman of σ against normalised
  position on the test R rows, per gated run;
- σ is not the weight a stream gets under logit-space fusion: R2L's share of the fused logit at t, by row kind;
- the primary endpoint's null is what the format rule gets with its ties broken at random, not 0 or 1/(n+1);
- power of each prediction at the observed intervals; loss floors under one standard for both streams; which
  machine and precision each run used.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import NormalDist

import numpy as np

from biprm.data.trajectory import Trajectory
from biprm.metrics.bootstrap import bootstrap_mean
from studies.mechanism.rows import KINDS
from studies.mechanism.report import _at, rows_by_kind
from studies.mechanism.v2 import LEVEL, MARGIN, format_rule, loss_floor, verdict
from biprm.scoring.step_scores import StepScores

ARMS = ("bi", "bi-gate-lr0.1")
PRIMARY = "primary: F's step t below every step of C"
# The σ contrasts, each a difference of σ at t between row kinds: (name, plus kinds, minus kinds).
SIGMA_CONTRASTS = (
    ("σ(L) − σ(F), pre-registered (worked − bare)", ("L",), ("F",)),
    ("σ(R) − σ(C), format only (worked − bare, both clean)", ("R",), ("C",)),
    ("σ(C) − σ(F), error only (both bare)", ("C",), ("F",)),
    ("σ(R) − σ(L), error only (both worked)", ("R",), ("L",)),
    ("difference-in-differences [σ(C) − σ(F)] − [σ(R) − σ(L)]", ("C", "L"), ("F", "R")),
)
# The same-format readings of prediction 5 ("σ at t lower on F rows than on L rows"): the error in bare steps, and
# the error's σ shift in bare steps beyond the one in worked steps.
STAND_INS = (SIGMA_CONTRASTS[2][0], SIGMA_CONTRASTS[4][0])
POWER_EFFECT = 10.0  # points: the true gain at which prediction 1's power is given


def _kept(values: np.ndarray) -> np.ndarray:
    return values[:, ~np.isnan(values).any(0)]


def sigma_contrasts(
    metrics: dict[str, list[dict[str, np.ndarray]]], arms: tuple[str, ...] = ARMS, level: float = LEVEL
) -> dict[str, dict[str, dict]]:
    """Per bi arm, SIGMA_CONTRASTS at `level` (intervals over seeds and questions), from `scorer_metrics`' σ columns."""
    out = {}
    for arm in arms:
        if arm not in metrics:
            continue
        at = {k: np.stack([m[f"σ at t, {k} rows"] for m in metrics[arm]]) for k in KINDS}
        out[arm] = {
            name: bootstrap_mean(_kept(sum(at[k] for k in plus) - sum(at[k] for k in minus)), level=level)
            for name, plus, minus in SIGMA_CONTRASTS
        }
    return out


def reread_verdicts(differences: dict, contrasts: dict[str, dict[str, dict]], better: str) -> dict[str, dict]:
    """`verdict()` with prediction 5 read as a same-format contrast (each in turn), and without prediction 5."""
    out = {}
    for name in STAND_INS:
        swapped = {**differences, "σ at t": {f"{arm}: L rows − F rows": c[name] for arm, c in contrasts.items()}}
        out[f"prediction 5 as {name}"] = verdict(swapped, ARMS, better)
    out["without prediction 5"] = verdict(differences, ARMS, better, sigma=False)
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties given their mean rank, as Spearman's coefficient needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, ranks) / counts)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ties averaged)."""
    return float(np.corrcoef(_ranks(np.asarray(x, float)), _ranks(np.asarray(y, float)))[0, 1])


TEMPLATE = "The answer is "  # every row's last line, "The answer is N.": the same words wherever the row's errors are


def template_steps(trajs: list[Trajectory]) -> np.ndarray:
    """Per step of `trajs`, laid end to end as StepScores lays them, whether it is the templated answer line."""
    return np.array([step.startswith(TEMPLATE) for t in trajs for step in t.steps], dtype=bool)


def position_spans(offsets: np.ndarray, rows: np.ndarray, keep: np.ndarray | None = None) -> tuple[list, np.ndarray]:
    """(per row, the flat indices of its kept steps; per flat step, its position k / (m − 1) among the m kept steps of
    its row). `keep` (per flat step, default all) leaves steps out before positions are counted; rows with fewer
    than two kept steps are left out."""
    keep = np.ones(offsets[-1], dtype=bool) if keep is None else keep
    spans = [span for r in rows if len(span := np.flatnonzero(keep[offsets[r] : offsets[r + 1]]) + offsets[r]) > 1]
    position = np.zeros(offsets[-1])
    for span in spans:
        position[span] = np.arange(len(span)) / (len(span) - 1)
    return spans, position


def sigma_by_position(s: StepScores, rows: np.ndarray, keep: np.ndarray | None = None) -> dict:
    """The paper's σ claim on one run: Spearman of σ against normalised position k / (n − 1) over every step of
    `rows` that `keep` keeps (`position_spans`), and the mean σ in each fifth of the positions."""
    spans, at = position_spans(s.offsets, rows, keep)
    steps = np.concatenate(spans)
    position, sigma = at[steps], s.sigma[steps]
    fifth = np.minimum((position * 5).astype(int), 4)
    return {"spearman": spearman(position, sigma), "by_fifth": [float(sigma[fifth == f].mean()) for f in range(5)]}


def r2l_share(s: StepScores, rows: np.ndarray, t: np.ndarray) -> float:
    """R2L's effective share of the fused logit at step t, mean over `rows`: |(1 − σ)·r2l| / (|σ·l2r| + |(1 − σ)·r2l|).
    Under logit-space fusion this, not 1 − σ, is how much of the decision R2L carries."""
    sigma, l2r, r2l = (_at_logit(s, name, rows, t) for name in ("sigma", "l2r", "r2l"))
    from_r2l, from_l2r = np.abs((1 - sigma) * r2l), np.abs(sigma * l2r)
    return float(np.nanmean(from_r2l / (from_r2l + from_l2r)))


def _at_logit(s: StepScores, name: str, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    values = getattr(s, name)
    scored = np.diff(s.offsets)[rows]
    return np.where(t < scored, values[s.offsets[rows] + np.minimum(t, scored - 1)], np.nan)


def format_null(test: list[Trajectory]) -> np.ndarray:
    """Per question, the primary endpoint's expected value for the format rule with its ties broken at random:
    F's step t is bare, so it is below every step of C with probability 1 / (m + 1), m being how many of C's
    steps share the rule's lowest score (its bare steps, step t among them). A scorer that reads no correctness
    and only marks bare steps low gets this."""
    rows, t = rows_by_kind(test)
    s = format_rule(test)
    out = []
    for f, c, step in zip(rows["F"], rows["C"], t):
        clean = s.fused[s.offsets[c] : s.offsets[c + 1]]
        low = clean.min()
        out.append(0.0 if s.fused[s.offsets[f] + step] > low else 1.0 / (np.sum(clean == low) + 1))
    return np.array(out)


def lowest_at_t(s: StepScores, test: list[Trajectory]) -> float:
    """The share of C rows whose lowest-scored step is the bare step t (the format cue a model can learn)."""
    rows, t = rows_by_kind(test)
    prob = s.prob()
    return float(np.mean([np.argmin(prob[s.offsets[c] : s.offsets[c + 1]]) == step for c, step in zip(rows["C"], t)]))


def power(interval: dict, bound: float, true: float, level: float = LEVEL, scale: float = 1.0) -> float:
    """The chance that an interval as wide as `interval` (its standard error times `scale`) clears `bound` when the true
    difference is `true`, on the side `true` lies: its low end above a bound below `true`, its high end below a bound
    above it (normal approximation, standard error from the interval's width)."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    se = scale * (interval["high"] - interval["low"]) / (2 * z)
    if se == 0:  # an interval of one point: it sits at the true value
        return float(true != bound)
    return NormalDist().cdf(abs(true - bound) / se - z)


def prediction_power(differences: dict) -> dict[str, dict]:
    """Per bi arm and prediction: the power it had at the observed intervals (prediction 1 at a true +POWER_EFFECT,
    the non-inferiority predictions at a true 0), and for prediction 5 the half-width of its interval: any
    wrong-sign shift larger than that contradicts it."""
    out = {}
    for arm in ARMS:
        p1 = differences[PRIMARY].get(f"{arm} − l2r")
        if p1 is None:
            continue
        p2 = differences["P2: L rows, first error exact"][f"{arm} − l2r"]
        s5 = differences["σ at t"][f"{arm}: L rows − F rows"]
        out[arm] = {
            f"1. beats l2r on F rows, at a true +{POWER_EFFECT:g}": power(p1, 0.0, POWER_EFFECT),
            "2. not worse than l2r on L rows, at a true 0": power(p2, -MARGIN, 0.0),
        }
        for label, other in (("3. at least as good as r2l", "r2l"), ("4. at least as good as bi-static", "bi-static")):
            if (d := differences[PRIMARY].get(f"{arm} − {other}")) is not None:
                out[arm][f"{label}, at a true 0"] = power(d, -MARGIN, 0.0)
        out[arm]["5. σ: half-width of its interval (no margin)"] = (s5["high"] - s5["low"]) / 2
    return out


def one_standard_floors(train: list[Trajectory]) -> dict:
    """Loss floors with the pre-registered reading and with one standard for both streams (`mechanism_v2._read`),
    and the share of training steps that the second standard changes for R2L (L rows after t)."""
    total = sum(len(x.steps) for x in train)
    after = sum(len(x.steps) - 1 - x.meta["step"] for x in train if x.meta["kind"] == "L")
    return {
        "pre-registered": {s: loss_floor(train, s) for s in ("l2r", "r2l")},
        "one standard": {s: loss_floor(train, s, one_standard=True) for s in ("l2r", "r2l")},
        "L rows after t, share of training steps": after / total,
    }


def machines(out: Path, primary: dict[str, float]) -> dict[str, dict]:
    """Per run: the device and precision it trained with (runs/RUN.json), beside its primary endpoint (%)."""
    found = {}
    for path in sorted((out / "runs").glob("*-seed*.json")):
        run = json.loads(path.read_text())
        found[run["run"]] = {
            "seed": run["seed"],
            "device": run["device"],
            "bf16": run["bf16"],
            "primary": primary.get(run["run"]),
        }
    return found


def reread(
    sets: dict[str, list[Trajectory]],
    groups: dict[str, list],
    metrics: dict[str, list[dict]],
    table: dict,
    differences: dict,
    better: str,
    out: Path,
) -> dict:
    """Every number of the post-hoc re-read (module doc)."""
    test = sets["test"]
    rows, t = rows_by_kind(test)
    contrasts = sigma_contrasts(metrics)
    gated = {name: s["test"] for arm in ARMS for name, s in groups.get(arm, [])}
    null = bootstrap_mean(100 * format_null(test)[None])
    lowest = {g: [lowest_at_t(s["test"], test) for _, s in runs] for g, runs in groups.items()}
    return {
        "sigma_contrasts": contrasts,
        "verdicts": reread_verdicts(differences, contrasts, better),
        "sigma_by_position": {name: sigma_by_position(s, rows["R"]) for name, s in gated.items()},
        "sigma_by_position_without_template": {
            name: sigma_by_position(s, rows["R"], ~template_steps(test)) for name, s in gated.items()
        },
        "r2l_share_at_t": {
            name: {k: r2l_share(s, rows[k], t) for k in KINDS}
            | {"σ": {k: float(np.nanmean(_at(s, "sigma", rows[k], t))) for k in KINDS}}
            for name, s in gated.items()
        },
        "format_null": null,
        "primary_beside_null": {g: table[g][PRIMARY] for g in table if g in groups},
        "clean_lowest_at_t": lowest,
        "power": prediction_power(differences),
        "loss_floors": one_standard_floors(sets["train"]),
        "machines": machines(
            out,
            {
                name: 100 * float(np.nanmean(m[PRIMARY]))
                for g, runs in groups.items()
                if g in metrics
                for (name, _), m in zip(runs, metrics[g])
            },
        ),
    }


def _interval(d: dict, digits: int, sign: str = "+") -> str:
    return f"{d['mean']:{sign}.{digits}f} [{d['low']:{sign}.{digits}f}, {d['high']:{sign}.{digits}f}]"


FLAT = 0.1  # |Spearman| below this: σ is flat with position, neither rising nor falling


def sigma_trend(spearman_of_run: float) -> str:
    """ "rises", "falls" or "flat": a run's σ against position, by its Spearman and FLAT."""
    return "rises" if spearman_of_run > FLAT else "falls" if spearman_of_run < -FLAT else "flat"


def sigma_rises_sentence(p: dict) -> str:
    """How many gated runs' σ rises with position (Spearman above +FLAT), with the templated answer line and without
    it, and how many show the paper's fuller claim (σ below 0.5 in the first fifth of positions, above it in the
    last)."""
    parts = []
    for key, label in (("sigma_by_position", "with"), ("sigma_by_position_without_template", "without")):
        runs = p[key]
        trends = [sigma_trend(v["spearman"]) for v in runs.values()]
        fuller = sum(v["by_fifth"][0] < 0.5 < v["by_fifth"][-1] for v in runs.values())
        parts.append(
            f"{label} the answer line, of {len(runs)} gated runs σ rises in {trends.count('rises')}, is flat in "
            f"{trends.count('flat')} and falls in {trends.count('falls')} (a Spearman beyond ±{FLAT}), and is below "
            f"0.5 in the first fifth and above it in the last in {fuller} (Spearman, test R rows: "
            + ", ".join(f"{n} {v['spearman']:+.2f}" for n, v in runs.items())
            + ")"
        )
    return "; ".join(parts)


def format_reread(r: dict, pre_registered: dict) -> str:
    """The pre-registered outcome and the post-hoc reading side by side, then the tables behind the second."""
    from biprm.analysis.common import markdown_table

    p = r["post_hoc"]
    pre = pre_registered["predictions"]
    sides = [
        [
            "verdict",
            f"**{pre_registered['outcome']}** (`verdict()`, prediction 5 as σ(L) − σ(F))",
            "; ".join(f"{name}: **{v['outcome']}**" for name, v in p["verdicts"].items()),
        ]
    ]
    for arm, c in p["sigma_contrasts"].items():
        sides.append(
            [
                f"{arm}: prediction 5",
                f"{pre[f'{arm}' + chr(39) + 's σ at step t is lower on F rows than on L rows']}: "
                f"{_interval(c[SIGMA_CONTRASTS[0][0]], 4)} (a bare step against a worked one)",
                f"format alone, σ(R) − σ(C): {_interval(c[SIGMA_CONTRASTS[1][0]], 4)}; same format, σ(C) − σ(F): "
                f"{_interval(c[SIGMA_CONTRASTS[2][0]], 4)}; difference-in-differences: "
                f"{_interval(c[SIGMA_CONTRASTS[4][0]], 4)}",
            ]
        )
    sides.append(["the paper's σ claim (σ rises with position)", "not tested", sigma_rises_sentence(p)])
    sides.append(
        [
            "primary endpoint's null",
            "0 (every rule that reads no model), 19.0 (i.i.d. noise)",
            f"{_interval(p['format_null'], 1, '')}: the format rule with its ties broken at random",
        ]
    )
    floors = p["loss_floors"]
    sides.append(
        [
            "R2L's loss floor",
            f"{floors['pre-registered']['r2l']:.3f} (L2R {floors['pre-registered']['l2r']:.3f})",
            f"{floors['one standard']['r2l']:.3f} under one standard for both streams (L2R "
            f"{floors['one standard']['l2r']:.3f}); "
            f"L rows after t are {100 * floors['L rows after t, share of training steps']:.1f} % of training steps",
        ]
    )
    md = [
        "## Post-hoc re-read (issue 48): not pre-registered, beside the pre-registered outcome",
        'Computed from the same committed logits by `v2_reread` (studies/mechanism/README.md, "Version 2: the post-hoc '
        're-read").',
        markdown_table(["", "pre-registered reading", "post-hoc re-read"], sides),
    ]
    md += [
        "### σ at t: contrasts by format (97.5 % intervals over seeds and questions)",
        markdown_table(
            ["contrast", *p["sigma_contrasts"]],
            [[name, *(_interval(c[name], 4) for c in p["sigma_contrasts"].values())] for name, _, _ in SIGMA_CONTRASTS],
        ),
    ]
    md += [
        "### σ by position (the paper's claim), and R2L's effective share of the fused logit at t",
        "Share = |(1 − σ)·r2l| / (|σ·l2r| + |(1 − σ)·r2l|) at step t, mean over rows; σ at t beside it.",
        markdown_table(
            [
                "run",
                "Spearman σ ~ position (test R rows)",
                "σ by fifth of position",
                "Spearman, without the answer line",
                "σ by fifth, without the answer line",
                *(f"R2L share, {k}" for k in KINDS),
                *(f"σ, {k}" for k in KINDS),
            ],
            [
                [
                    n,
                    f"{v['spearman']:+.3f}",
                    " ".join(f"{x:.3f}" for x in v["by_fifth"]),
                    f"{p['sigma_by_position_without_template'][n]['spearman']:+.3f}",
                    " ".join(f"{x:.3f}" for x in p["sigma_by_position_without_template"][n]["by_fifth"]),
                    *(f"{p['r2l_share_at_t'][n][k]:.3f}" for k in KINDS),
                    *(f"{p['r2l_share_at_t'][n]['σ'][k]:.3f}" for k in KINDS),
                ]
                for n, v in p["sigma_by_position"].items()
            ],
        ),
    ]
    lowest = p["clean_lowest_at_t"]
    md += [
        "### The primary endpoint beside its format-aware null (%)",
        markdown_table(
            ["scorer", "primary", "C rows whose lowest step is the bare step t (per seed)"],
            [
                [g, _interval(v, 1, ""), ", ".join(f"{100 * x:.1f}" for x in lowest.get(g, []))]
                for g, v in p["primary_beside_null"].items()
            ]
            + [["format rule, ties broken at random", _interval(p["format_null"], 1, ""), "100 (by construction)"]],
        ),
    ]
    md += [
        "### Power each prediction had at the observed intervals (97.5 %, normal approximation)",
        markdown_table(
            ["prediction", *p["power"]],
            [
                [
                    name,
                    *(
                        f"{v[name]:.4f}" if name.startswith("5.") else f"{100 * v[name]:.0f} %"
                        for v in p["power"].values()
                    ),
                ]
                for name in next(iter(p["power"].values()))
            ],
        ),
    ]
    md += [
        "### Where each run trained",
        markdown_table(
            ["run", "seed", "device", "bf16", "primary endpoint (%)"],
            [
                [n, str(v["seed"]), v["device"], str(v["bf16"]), "–" if v["primary"] is None else f"{v['primary']:.1f}"]
                for n, v in p["machines"].items()
            ],
        ),
        "Seeds 1106 and 1107 trained on one machine and precision, 1108 on another: an effect of precision would show "
        "as seed spread, and these runs cannot tell the two apart.",
    ]
    return "\n\n".join(md) + "\n"
