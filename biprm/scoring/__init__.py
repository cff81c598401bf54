"""The scoring wing: trajectories -> per-step scores -> solution scores, on one process or many.

`step_scores` holds `StepScores` (flat per-step logits with offsets) and its npz files,
`aggregate` the step -> solution operators, `scorer` the batched model passes, `score_file`
the `biprm score` command, and `process_group` the process group it and `biprm eval` share.
Partial solutions, as a search asks for them, are scored behind one contract (`paths`):
`prefix` grows L2R on a KV cache across depths, `served` asks a running `biprm serve`.
The names below load on first use, so a module that needs only `aggregate` (numpy) never
pays for torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "StepScores": "step_scores",
    "save_scores": "step_scores",
    "load_scores": "step_scores",
    "Scorer": "scorer",
    "Budgets": "scorer",
    "CPU_BUDGETS": "scorer",
    "device_budgets": "scorer",
    "PathScorer": "paths",
    "PathScore": "paths",
    "PrefixScorer": "prefix",
    "ServedScorer": "served",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'biprm.scoring' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"biprm.scoring.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
