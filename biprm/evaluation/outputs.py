"""The score cache of an evaluation command, and how results are written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from biprm.evaluation.cache import ScoreCache
from biprm.evaluation.config import EvalOptions


def open_cache(cfg: EvalOptions) -> ScoreCache:
    return ScoreCache(cfg.cache_dir or Path(cfg.out) / "cache", cfg)


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


def provenance(models: list[dict], files: dict[str, str] | None = None) -> str:
    """A report's line naming what each label stands for: every model's resolved folder and kind, every data file."""
    parts = [f"`{m['label']}`: {m['kind']} at {m['path']}" for m in models]
    parts += [f"`{label}`: {path}" for label, path in (files or {}).items()]
    return f"Read: {'; '.join(parts)}.\n\n" if parts else ""
