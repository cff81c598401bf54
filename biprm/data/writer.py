"""How files reach disk: whole or not at all (`atomic_write`); a built training set as the JSONL `biprm train` reads."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from biprm.data.trajectory import Trajectory


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """`write(f)` into a temporary file beside `path`, synced, then renamed over it: a reader, or a run that is
    killed midway, sees the old file or the new one, never half of one. The temporary file is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_trajectories(path: str | Path, trajs: list[Trajectory]) -> Path:
    """Labelled trajectories as TRL stepwise-supervision JSONL (`prompt`, `completions`, `labels`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for traj in trajs:
            labels = [bool(x) if x in (0, 1) else float(x) for x in traj.labels]
            f.write(json.dumps({"prompt": traj.question, "completions": traj.steps, "labels": labels}) + "\n")
    return path
