"""A data spec (what users type after --data) -> Trajectories.

`synthetic[:N[:SEED]]` is the embedded task; anything else is a local file or a
Hugging Face dataset name handled by `biprm.readers`.
"""
from __future__ import annotations

from biprm.readers import load_trajectories
from biprm.synthetic import make_dataset
from biprm.trajectory import DataError, Trajectory


def load_source(spec: str, fmt: str = "auto", split: str = "train", skip_invalid: bool = False, labelled: bool = False) -> list[Trajectory]:
    if spec == "synthetic" or spec.startswith("synthetic:"):
        parts = spec.split(":")
        n = int(parts[1]) if len(parts) > 1 else 2000
        seed = int(parts[2]) if len(parts) > 2 else 0
        return make_dataset(n, seed)
    trajs = load_trajectories(spec, fmt=fmt, split=split, skip_invalid=skip_invalid)
    if labelled:
        missing = next((i for i, t in enumerate(trajs) if t.labels is None), None)
        if missing is not None:
            raise DataError(f"{spec} row {missing + 1}: field 'labels' is missing; training needs step labels")
    return trajs
