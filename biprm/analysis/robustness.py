"""Paper Table "step boundary perturbations": first-error F1 on clean vs perturbed ProcessBench.

The perturbed set comes from `biprm.data.perturb.perturb_dataset`, whose trajectories carry
re-mapped first-error labels and keep meta "subset", so both sets are scored the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from biprm.analysis.common import TITLES, first_error_report, markdown_table, threshold_of
from biprm.data.trajectory import Trajectory
from biprm.scoring.step_scores import StepScores


def _f1_row(report: dict) -> dict[str, float]:
    return {**{name: s["f1"] for name, s in report["subsets"].items()}, "average": report["average_f1"]}


def perturbation_robustness(
    clean_scores: dict[str, StepScores],
    perturbed_scores: dict[str, StepScores],
    clean_trajs: Sequence[Trajectory],
    perturbed_trajs: Sequence[Trajectory],
    threshold: float | Mapping[str, float] = 0.5,
) -> dict:
    """F1 per mode and subset (plus "average", the mean over subsets) on both sets, and the drop clean − perturbed.

    Returns {"threshold": {mode: t}, "columns": [subsets..., "average"],
    "modes": {mode: {"clean": {col: F1}, "perturbed": {col: F1}, "drop": {col: points}}}}.
    """
    if clean_scores.keys() != perturbed_scores.keys():
        raise ValueError(f"modes differ: clean {sorted(clean_scores)} vs perturbed {sorted(perturbed_scores)}")
    modes, thresholds = {}, {}
    for mode in clean_scores:
        thresholds[mode] = threshold_of(threshold, mode)
        clean = _f1_row(first_error_report(clean_trajs, clean_scores[mode], thresholds[mode]))
        perturbed = _f1_row(first_error_report(perturbed_trajs, perturbed_scores[mode], thresholds[mode]))
        if clean.keys() != perturbed.keys():
            raise ValueError(f"subsets differ between the clean and perturbed sets: {list(clean)} vs {list(perturbed)}")
        modes[mode] = {"clean": clean, "perturbed": perturbed, "drop": {k: clean[k] - perturbed[k] for k in clean}}
    columns = list(next(iter(modes.values()))["clean"]) if modes else []
    return {"threshold": thresholds, "columns": columns, "modes": modes}


def format_perturbation_table(result: dict) -> str:
    """Markdown like the paper: "perturbed F1 (↓drop)" per subset and on average, the best F1 per column in bold."""
    cols, modes = result["columns"], result["modes"]
    best = {c: np.nanmax([m["perturbed"][c] for m in modes.values()]) for c in cols}

    def cell(m: dict, c: str) -> str:
        f1, drop = m["perturbed"][c], m["drop"][c]
        value = f"**{f1:.1f}**" if f1 >= best[c] - 1e-9 else f"{f1:.1f}"
        return f"{value} ({'↓' if drop >= 0 else '↑'}{abs(drop):.1f})"

    rows = [[mode] + [cell(m, c) for c in cols] for mode, m in modes.items()]
    return markdown_table(["mode", *(TITLES.get(c, c) if c != "average" else "Average" for c in cols)], rows)
