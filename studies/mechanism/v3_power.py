"""Power of amended version 3's judged predictions, from variance components (question and seed) estimated on version
2's committed logits (studies/mechanism/PREREGISTRATION_v3_amended.md).

A judged quantity is a mean over S seeds and Q test questions of per-(seed, question) values d[s, q]: a paired
difference of two arms, seed k of one beside seed k of the other. Its variance is

    seed / S + question / Q + residual / (S · Q)

with the three components from a two-way analysis of variance of version 2's d (`components`). The first version 3
design shrank the whole standard error by √(3/20), as though all of it were seed spread; the question part does not
shrink with seeds, so that overstated power. A statistic that is not a mean of per-question values (the σ-by-position
Spearman of a run) gets its question part from resampling questions within each run (`statistic_components`).

`python -m studies.mechanism.v3_power` writes `results/v3_power.json` from the committed version 2 logits (about a
minute); the amended design quotes it.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

COMPONENTS = ("seed", "question", "residual")


def components(d: np.ndarray) -> dict[str, float]:
    """Variance components of a [seeds, questions] array (two-way analysis of variance without replication; a
    negative estimate is read as 0): `seed`, the spread of a seed's mean; `question`, of a question's; `residual`,
    what is left in one cell."""
    d = np.asarray(d, dtype=np.float64)
    s, q = d.shape
    if s < 2 or q < 2:
        raise ValueError(f"variance components need at least 2 seeds and 2 questions, got {s} × {q}")
    grand, by_seed, by_question = d.mean(), d.mean(1), d.mean(0)
    ms_seed = q * np.sum((by_seed - grand) ** 2) / (s - 1)
    ms_question = s * np.sum((by_question - grand) ** 2) / (q - 1)
    ms_residual = np.sum((d - by_seed[:, None] - by_question[None] + grand) ** 2) / ((s - 1) * (q - 1))
    return {
        "seed": float(max((ms_seed - ms_residual) / q, 0.0)),
        "question": float(max((ms_question - ms_residual) / s, 0.0)),
        "residual": float(ms_residual),
    }


def statistic_components(per_run: np.ndarray, question_variance: float, questions: int) -> dict[str, float]:
    """Components of a mean over runs of a per-run statistic, from the runs' values and the variance of one run's value
    when its `questions` are resampled (mean over runs). The question part is counted once, not divided by the seeds:
    every run reads the same questions, so their question noise is taken as shared (an upper bound)."""
    spread = float(np.var(per_run, ddof=1)) if len(per_run) > 1 else 0.0
    return {
        "seed": max(spread - question_variance, 0.0),
        "question": question_variance * questions,
        "residual": 0.0,
    }


def standard_error(c: dict[str, float], seeds: int, questions: int) -> float:
    """The standard error of a mean over `seeds` seeds and `questions` questions with components `c`."""
    return math.sqrt(c["seed"] / seeds + c["question"] / questions + c["residual"] / (seeds * questions))


def power(c: dict[str, float], seeds: int, questions: int, true: float, margin: float, level: float) -> float:
    """The chance that the `level` interval lands wholly on `true`'s side of `margin`: held (its low end above the
    margin) when `true` is above it, contradicted (its high end below) when below (normal approximation)."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    se = standard_error(c, seeds, questions)
    if se == 0:
        return float(true != margin)
    return NormalDist().cdf(abs(true - margin) / se - z)


def seeds_needed(
    c: dict[str, float],
    questions: int,
    true: float,
    margin: float,
    level: float,
    target: float = 0.8,
    most: int = 10000,
) -> int | None:
    """The fewest seeds at which `power` reaches `target`; None when even `most` seeds do not (the question part alone
    is too wide)."""
    return next((s for s in range(2, most + 1) if power(c, s, questions, true, margin, level) >= target), None)


# ---- version 2's components, and the amended design's power --------------------------------------


def primary_by_seed(runs: list[dict], test: list) -> np.ndarray:
    """[seeds, questions] of the primary endpoint (points), from each run's test logits."""
    from studies.mechanism.report import rows_by_kind
    from studies.mechanism.v2 import below_every_clean_step

    rows, t = rows_by_kind(test)
    return 100 * np.stack([below_every_clean_step(s["test"], rows["F"], rows["C"], t) for s in runs])


def question_variance(run, spans: list, position: np.ndarray, resamples: int = 200, seed: int = 0) -> float:
    """The variance of one run's σ-by-position Spearman when its questions (spans) are resampled."""
    from studies.mechanism.v2_reread import spearman

    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        steps = np.concatenate([spans[q] for q in rng.integers(len(spans), size=len(spans))])
        draws.append(spearman(position[steps], run.sigma[steps]))
    return float(np.var(draws, ddof=1))


def sigma_components(runs: list[dict], test: list) -> dict:
    """Per-run Spearman of σ against position on test R rows, the answer line left out, and its components."""
    from studies.mechanism.report import rows_by_kind
    from studies.mechanism.v2_reread import position_spans, spearman, template_steps

    rows, _ = rows_by_kind(test)
    spans, position = position_spans(runs[0]["test"].offsets, rows["R"], ~template_steps(test))
    steps = np.concatenate(spans)
    per_run = np.array([spearman(position[steps], s["test"].sigma[steps]) for s in runs])
    within = float(np.mean([question_variance(s["test"], spans, position) for s in runs]))
    return {"per_run": per_run.tolist(), "questions": len(spans), **statistic_components(per_run, within, len(spans))}


# What each judged prediction (`v3.PREDICTIONS`) measures: a primary-endpoint difference, or σ rising; ARM, the verdict
# arm.
ARM = "arm"
JUDGED = {
    "r2l_beats_l2r": "r2l − l2r",
    "gate_beats_static": f"{ARM} − bi-static",
    "gate_beats_l2r": f"{ARM} − l2r",
    "sigma_rises": ARM,
}


def judged_components(groups: dict[str, list], test: list, arm: str) -> dict[str, dict]:
    """Version 2's components of each judged quantity (JUDGED): a primary-endpoint difference, or σ rising."""
    out = {}
    for key, quantity in JUDGED.items():
        names = quantity.replace(ARM, arm).split(" − ")
        if len(names) == 1:
            out[key] = sigma_components([s for _, s in groups[arm]], test)
            continue
        d = np.subtract(*(primary_by_seed([s for _, s in groups[g]], test) for g in names))
        d = d[:, ~np.isnan(d).any(0)]
        out[key] = {"mean": float(d.mean()), "questions": d.shape[1], **components(d)}
    return out


def design_power(
    found: dict[str, dict], margins: dict, effects: dict, seeds: int, questions: int, level: float
) -> dict:
    """Per judged prediction: its power at the design's seeds and questions at the effect it is powered for (the same
    chance to be contradicted at 0, the margin being halfway), and the seeds that would give 80 %."""
    out = {}
    for key, c in found.items():
        effect, margin = effects[key][0], margins[key]
        out[key] = {
            "effect": effect,
            "margin": margin,
            "standard_error": standard_error(c, seeds, questions),
            "power": power(c, seeds, questions, effect, margin, level),
            "seeds_for_80": seeds_needed(c, questions, effect, margin, level),
        }
    return out


def main() -> None:
    """Write results/v3_power.json: version 2's components; the amended design's power at its seeds and questions."""
    import json
    from pathlib import Path

    from biprm.evaluation.outputs import write_json
    from studies.mechanism.config import MechanismConfig, design
    from studies.mechanism.report import _collect
    from studies.mechanism.rows import build_mechanism
    from studies.mechanism.v3 import PREDICTIONS

    here = Path(__file__).parent
    amended = design("3_amended")
    v2 = MechanismConfig(**design(2) | {"out": str(here / "results" / "v2")})
    test = build_mechanism(v2.data_root, 1, 1, v2.test_questions, v2.data_seed, labels="own", keep_roundness=True)[0]
    planned = build_mechanism(
        v2.data_root, 1, 1, amended["test_questions"], amended["data_seed"], labels="own", keep_roundness=True
    )[0]["test"]
    arm = amended["verdict_arm"]
    found = {a: judged_components(_collect(v2), test["test"], a) for a in (arm, "bi-gate-lr0.1")}
    seeds, questions = amended["seeds"][arm], len(planned) // 4
    result = {
        "from": "version 2's committed logits (studies/mechanism/results/v2/runs), test R/C/F/L rows",
        "level": amended["level"],
        "planned": {"seeds": seeds, "questions": questions},
        "judged": {key: statement for key, (statement, _) in PREDICTIONS.items()},
        "verdict_arm": arm,
        "components": found,
        "power": {
            a: design_power(c, amended["margins"], amended["power_at"], seeds, questions, amended["level"])
            for a, c in found.items()
        },
    }
    write_json(here / "results" / "v3_power.json", result)
    print(json.dumps(result["power"], indent=1))


if __name__ == "__main__":
    main()
