"""Paper Fig. 4: where along a solution each PRM errs (a), and which stream the gate trusts there (b).

Positions are normalised as (t + 0.5) / T, so a step sits at the centre of its share
of the solution, and the error onset uses the same scale as the bins it is drawn over.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from biprm.analysis.common import first_errors, step_labels
from biprm.analysis.plots import position_curve
from biprm.data.trajectory import Trajectory
from biprm.scoring.step_scores import StepScores


def error_onset(trajs: Sequence[Trajectory]) -> float:
    """Mean normalised position of the first wrong step over erroneous trajectories (NaN if none)."""
    first = first_errors(trajs)
    n_steps = np.array([len(t.steps) for t in trajs])
    wrong = first >= 0
    return float(np.mean((first[wrong] + 0.5) / n_steps[wrong])) if wrong.any() else float("nan")


def mae_by_position(trajs: Sequence[Trajectory], scores: dict[str, StepScores], bins: int = 10) -> dict:
    """|p_t − y_t| of each mode's fused probability, binned by position, plus its overall mean.

    Returns {"bins", "curves": {mode: {"position", "mean", "count", "overall"}},
    "error_onset", "n_erroneous", "n_trajectories"}; empty bins are NaN.
    """
    curves = {}
    for mode, s in scores.items():
        err = np.abs(s.prob() - step_labels(trajs, s.offsets))
        curves[mode] = {**position_curve(err, s.offsets, bins), "overall": float(err.mean())}
    return {
        "bins": bins,
        "curves": curves,
        "error_onset": error_onset(trajs),
        "n_erroneous": int((first_errors(trajs) >= 0).sum()),
        "n_trajectories": len(trajs),
    }


def sigma_by_position(scores_bi: StepScores, bins: int = 10) -> dict:
    """Mean gate weight on the L2R stream by position: {"bins", "curve": {"position", "mean", "count", "overall"}}."""
    if scores_bi.sigma is None:
        raise ValueError("these scores carry no gate values; score with a 'bi' or 'bi-static' model")
    curve = position_curve(scores_bi.sigma, scores_bi.offsets, bins)
    return {"bins": bins, "curve": {**curve, "overall": float(np.mean(scores_bi.sigma))}}
