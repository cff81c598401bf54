"""Trajectories -> JSONL that `biprm train` reads back: the way a built training set reaches disk."""
from __future__ import annotations

import json
from pathlib import Path

from biprm.data.trajectory import Trajectory


def write_trajectories(path: str | Path, trajs: list[Trajectory]) -> Path:
    """Labelled trajectories as TRL stepwise-supervision JSONL (`prompt`, `completions`, `labels`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for traj in trajs:
            labels = [bool(x) if x in (0, 1) else float(x) for x in traj.labels]
            f.write(json.dumps({"prompt": traj.question, "completions": traj.steps, "labels": labels}) + "\n")
    return path
