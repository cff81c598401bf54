"""Version 2 of the mechanism study (studies/mechanism/README.md): what each stream can learn, what a text cue
scores, the endpoints and the verdict rule, as pure functions of rows and per-item scores.

Every scorer, trained or not, goes through the same endpoint code: the rules that read text (the
format rule, the rounder-number rule), the position rules and noise are written as step scores
(`StepScores` logits), so a cue that survives in the data shows up in the same column as the models.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from biprm.data.trajectory import Trajectory
from biprm.metrics.first_error import predict_first_error
from biprm.metrics.ranking import paired_win
from studies.replication.data import _results, _value
from studies.mechanism.rows import KINDS, roundness
from studies.mechanism.report import _at, rows_by_kind
from biprm.scoring.step_scores import StepScores

CLEAN_PASS = 0.9  # P1's threshold lets this share of clean validation rows (R and C) through unflagged
MARGIN = 5.0  # points: "not worse than" means a paired interval whose low end is above -MARGIN
LEVEL = 0.975  # two bi arms are judged, so each interval is 97.5 % (Bonferroni)


# ---- what each stream can learn -------------------------------------------------------------


def _read(traj: Trajectory, k: int, stream: str, one_standard: bool = False) -> tuple:
    """What a stream knows when it scores step k: the question and the steps up to k (l2r), from the last
    step back to k (r2l), or all of them and the position (bi). The value a bare step t states (C and F
    rows) cannot be checked from before it, so until a later step is read it is only "a value".

    `one_standard` (post hoc, issue 48) applies that rule to R2L as well: after t, every value derived from
    step t's result (the right one in R, C and F, the carried wrong one in L) can be checked only against
    step t, which R2L has not read yet, so the four rows of a question read alike there."""
    if one_standard and stream == "r2l" and k > traj.meta.get("step", k):
        return (traj.question, "after step t", k)
    if stream == "l2r":
        steps = traj.steps[: k + 1]
        if k == traj.meta.get("step") and traj.meta.get("kind") in (
            "C",
            "F",
        ):  # only L2R reads step t before what reuses it
            steps = [
                *steps[:-1],
                steps[-1].replace(traj.meta["from" if traj.meta["kind"] == "C" else "to"], "<value>", 1),
            ]
        return (traj.question, *steps)
    if stream == "r2l":
        return (traj.question, *traj.steps[k:])
    return (traj.question, k, *traj.steps)


def _entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log(p) + (1 - p) * math.log(1 - p))


def loss_floor(trajs: list[Trajectory], stream: str, one_standard: bool = False) -> float:
    """The lowest mean BCE (nats per step) a model reading what `stream` reads can reach on these rows.

    Steps whose input is the same (`_read`) must get one probability, so the best it can do is each such
    group's label mean, and the floor is the label entropy within the groups, weighted by their size. A
    model that memorises every training row can go lower only by telling apart what it cannot check.
    """
    groups: dict[tuple, list[float]] = {}
    for traj in trajs:
        for k, label in enumerate(traj.labels):
            groups.setdefault(_read(traj, k, stream, one_standard), []).append(label)
    total = sum(len(g) for g in groups.values())
    return sum(len(g) * _entropy(float(np.mean(g))) for g in groups.values()) / total


# ---- scorers that read no model ---------------------------------------------------------------


def _as_scores(per_row: list[list[float]]) -> StepScores:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in per_row])]).astype(np.int64)
    return StepScores(offsets, np.concatenate(per_row).astype(np.float64) if per_row else np.zeros(0))


def format_rule(trajs: list[Trajectory]) -> StepScores:
    """Low on a non-final step that states a result without "=" (version 1's C and F rows bared step t)."""
    return _as_scores(
        [[-1.0 if k < len(t.steps) - 1 and "=" not in s else 1.0 for k, s in enumerate(t.steps)] for t in trajs]
    )


def rounder_number_score(step: str) -> float:
    """Higher for a rounder last result: two points per trailing zero, one for a last digit 5, minus one per decimal
    place."""
    found = list(_results(step))
    if not found:
        return 0.0
    places, zeros, five = roundness(_value(found[-1].group()))
    return 2.0 * zeros + five - places


def rounder_number_rule(trajs: list[Trajectory]) -> StepScores:
    """A step is trusted as much as its result is round (version 1 drew wrong values less round than right ones)."""
    return _as_scores([[rounder_number_score(s) for s in t.steps] for t in trajs])


def position_rule(trajs: list[Trajectory], predicted: np.ndarray) -> StepScores:
    """A rule that reads no text: low at its predicted step (-1: none), high elsewhere."""
    return _as_scores([[-1.0 if k == p else 1.0 for k in range(len(t.steps))] for t, p in zip(trajs, predicted)])


def noise(trajs: list[Trajectory], seed: int) -> StepScores:
    """I.i.d. standard-normal step scores: chance, through the same endpoint code as the models."""
    rng = np.random.default_rng(seed)
    return _as_scores([rng.standard_normal(len(t.steps)).tolist() for t in trajs])


# ---- endpoints ------------------------------------------------------------------------------------


def below_every_clean_step(
    s: StepScores, f_rows: np.ndarray, c_rows: np.ndarray, t: np.ndarray, stream: str = "fused"
) -> np.ndarray:
    """The primary endpoint, per question: 1 where the F row's step t is scored strictly below every step
    of its C twin, else 0. The twins differ only in the number at step t, so any scorer that reads no
    text scores them alike and gets 0; i.i.d. noise gets 1/(n+1) on n steps."""
    prob, o = s.prob(stream), s.offsets
    at = _at(s, stream, f_rows, t)  # NaN where step t was cut off at max_length
    return np.array([np.nan if np.isnan(a) else float(a < prob[o[c] : o[c + 1]].min()) for a, c in zip(at, c_rows)])


def chance_below_every_clean_step(n_steps: np.ndarray) -> np.ndarray:
    """The primary endpoint's expected value under i.i.d. continuous scores: one in n + 1."""
    return 1.0 / (np.asarray(n_steps, dtype=np.float64) + 1)


def clean_pass_threshold(s: StepScores, clean_rows: np.ndarray, share: float = CLEAN_PASS) -> float:
    """The largest threshold at which at least `share` of the clean rows have no step below it
    (a step is flagged when its probability is below the threshold)."""
    lowest = np.sort([s.prob()[s.offsets[r] : s.offsets[r + 1]].min() for r in clean_rows])
    return float(lowest[int(math.floor((1 - share) * len(lowest)))])


def endpoints(s: StepScores, trajs: list[Trajectory], threshold: float) -> dict[str, np.ndarray]:
    """Per question: the primary endpoint, P1 and P2 at `threshold`, whether each clean row passes, and S1."""
    rows, t = rows_by_kind(trajs)
    pred = {k: predict_first_error(s.prob(), s.offsets, threshold)[rows[k]] for k in KINDS}
    out = {
        "primary: F's step t below every step of C": below_every_clean_step(s, rows["F"], rows["C"], t),
        "P1: F rows, first error exact": pred["F"] == t,
        "P2: L rows, first error exact": pred["L"] == t,
        "R rows: no error": pred["R"] == -1,
        "C rows: no error": pred["C"] == -1,
    }
    at = {k: _at(s, "fused", rows[k], t) for k in KINDS}
    out["S1: C > F at t"] = paired_win(at["C"], at["F"])
    out["S1: R > L at t"] = paired_win(at["R"], at["L"])
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def minimum_detectable_effect(se: float, level: float = LEVEL, power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at `level` finds with probability `power`, given the
    standard error of the paired difference: (z_{(1+level)/2} + z_power) × se."""
    z = NormalDist().inv_cdf
    return (z((1 + level) / 2) + z(power)) * se


# ---- the verdict ------------------------------------------------------------------------------


def predictions(arm: str, better: str, sigma: bool = True) -> dict[str, tuple[str, str, float]]:
    """The paper's predictions for one bi arm: name -> (endpoint, paired difference, bound its low end must pass);
    `sigma=False` leaves out prediction 5 (the post-hoc re-read asks what the rule says without it)."""
    primary = "primary: F's step t below every step of C"
    found = {
        f"{arm} beats l2r on F rows": (primary, f"{arm} − l2r", 0.0),
        f"{arm} is not worse than l2r on L rows": ("P2: L rows, first error exact", f"{arm} − l2r", -MARGIN),
        f"{arm} is at least as good as the better single stream ({better})": (primary, f"{arm} − {better}", -MARGIN),
        f"{arm} is at least as good as bi-static": (primary, f"{arm} − bi-static", -MARGIN),
        f"{arm}'s σ at step t is lower on F rows than on L rows": ("σ at t", f"{arm}: L rows − F rows", 0.0),
    }
    return found if sigma else {name: p for name, p in found.items() if p[0] != "σ at t"}


def verdict(differences: dict[str, dict[str, dict]], arms: tuple[str, ...], better: str, sigma: bool = True) -> dict:
    """The pre-registered rule. Each prediction is "held" (its interval's low end passes its bound),
    "contradicted" (its high end is below the bound) or "undecided" (the interval holds the bound).
    The mechanism is supported when every prediction holds for one bi arm, contradicted when every arm
    has a contradicted prediction, and otherwise not decided at this power.

    `differences[endpoint][difference]` holds {"mean", "low", "high"} (intervals at LEVEL), in points
    for the endpoints and in σ's own units for σ.
    """
    outcomes, missing = {}, []
    for arm in arms:
        for name, (endpoint, diff, bound) in predictions(arm, better, sigma).items():
            interval = differences.get(endpoint, {}).get(diff)
            if interval is None:
                missing.append(name)
            else:
                outcomes[name] = (
                    "held" if interval["low"] > bound else "contradicted" if interval["high"] < bound else "undecided"
                )
    if missing:
        return {"outcome": "not yet decidable", "predictions": outcomes, "missing": missing}
    by_arm = {a: [outcomes[name] for name in predictions(a, better, sigma)] for a in arms}
    supported = [a for a, o in by_arm.items() if all(x == "held" for x in o)]
    if supported:
        outcome = f"supported ({', '.join(supported)})"
    elif all("contradicted" in o for o in by_arm.values()):
        outcome = "contradicted"
    else:
        outcome = "not decided at this power"
    return {"outcome": outcome, "predictions": outcomes, "missing": []}
