"""Scores -> JSONL, one line per trajectory, ready for any downstream tool."""
from __future__ import annotations

import json
from pathlib import Path

from biprm.aggregate import AGGREGATIONS
from biprm.scores import StepScores
from biprm.trajectory import Trajectory


def write_scores(path: str, trajs: list[Trajectory], scores: StepScores) -> int:
    solution = {how: scores.solution_scores(how) for how in AGGREGATIONS}
    streams = [s for s in ("l2r", "r2l", "sigma", "fused") if getattr(scores, s) is not None]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, traj in enumerate(trajs):
            row = {"question": traj.question, "steps": traj.steps, "meta": traj.meta}
            row.update({s: [round(float(x), 6) for x in scores.of(i, s)] for s in streams})
            row["solution"] = {how: float(solution[how][i]) for how in AGGREGATIONS}
            f.write(json.dumps(row) + "\n")
    return len(trajs)


def write_trajectories(path: str | Path, trajs: list[Trajectory]) -> Path:
    """Labelled trajectories as TRL stepwise-supervision JSONL (`prompt`, `completions`, `labels`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for traj in trajs:
            labels = [bool(x) if x in (0, 1) else float(x) for x in traj.labels]
            f.write(json.dumps({"prompt": traj.question, "completions": traj.steps, "labels": labels}) + "\n")
    return path
