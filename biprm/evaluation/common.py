"""Options every evaluation command shares, and how results are written."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from biprm.evaluation.cache import ScoreCache, ScorerSettings
from biprm.config import default_data_root


@dataclass(kw_only=True)
class EvalOptions:
    """`limit`: questions per pool and rows per ProcessBench subset (evenly spaced), for quick runs."""

    data_root: str = field(default_factory=default_data_root)
    out: str = "eval"
    cache_dir: str | None = None
    limit: int | None = None
    grade_workers: int = 2
    grade_timeout: float = 5.0  # seconds per answer; a grade that takes longer is reported and retried next run
    scorer: ScorerSettings = field(default_factory=ScorerSettings)

    def open_cache(self) -> ScoreCache:
        return ScoreCache(self.cache_dir or Path(self.out) / "cache", self.scorer)


def jsonable(value):
    """NaN -> null (strict JSON has no NaN), numpy scalars and arrays -> Python, dict keys -> str."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(result), indent=2, ensure_ascii=False))


def write_outputs(out: str, stem: str, result: dict, markdown: str) -> Path:
    """`<out>/<stem>.json` and `<out>/<stem>.md`; returns the Markdown path."""
    write_json(Path(out) / f"{stem}.json", result)
    path = Path(out) / f"{stem}.md"
    path.write_text(markdown)
    return path
