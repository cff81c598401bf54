"""A data spec (what users type after --data) -> Trajectories.

`synthetic[:N[:SEED]]` is the embedded task; anything else is a local file or a
Hugging Face dataset name handled by `biprm.readers`.
"""
from __future__ import annotations

from pathlib import Path

from biprm.readers import load_trajectories, looks_like_path, read_rows
from biprm.synthetic import make_dataset
from biprm.trajectory import DataError, Trajectory


def synthetic_spec(spec: str) -> tuple[int, int] | None:
    """(rows, seed) of "synthetic[:N[:SEED]]", None for any other source."""
    if spec != "synthetic" and not spec.startswith("synthetic:"):
        return None
    parts = spec.split(":")
    return (int(parts[1]) if len(parts) > 1 else 2000, int(parts[2]) if len(parts) > 2 else 0)


def check_source(spec: str) -> None:
    """Name a data path that is not there at once, before a model loads (a Hub name is checked when it is read)."""
    path = Path(spec).expanduser()
    if synthetic_spec(spec) is None and not path.is_file() and (path.exists() or looks_like_path(spec)):
        read_rows(spec)  # raises the reader's one-line error, naming the path


def load_source(spec: str, fmt: str = "auto", split: str = "train", skip_invalid: bool = False, labelled: bool = False) -> list[Trajectory]:
    synthetic = synthetic_spec(spec)
    if synthetic is not None:
        return make_dataset(*synthetic)
    trajs = load_trajectories(spec, fmt=fmt, split=split, skip_invalid=skip_invalid)
    if labelled:
        missing = next((i for i, t in enumerate(trajs) if t.labels is None), None)
        if missing is not None:
            raise DataError(f"{spec} row {missing + 1}: field 'labels' is missing; training needs step labels")
    return trajs
