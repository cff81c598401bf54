"""biprm: Bidirectional Process Reward Models.

Data flows one way: raw rows -> Trajectory -> encoded L2R/R2L pieces (the `data`
wing) -> one packed batch (packing) -> per-step outputs (modeling) -> solution
scores (the `scoring` wing) -> metrics and reports (metrics, analysis, evaluation).

The names below load on first use, so `biprm --help` does not pay for torch.
`import biprm.modeling` registers the architecture with `AutoModel`. The training
recipe lives in `biprm.training`, so `biprm.train` is always the function.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "BiPRMConfig": "biprm.modeling",
    "BiPRMModel": "biprm.modeling",
    "from_backbone": "biprm.modeling",
    "StepScores": "biprm.scoring.step_scores",
    "Scorer": "biprm.scoring.scorer",
    "TrainConfig": "biprm.config",
    "train": "biprm.training",
    "BiPRMTrainer": "biprm.training",
    "DataError": "biprm.data.trajectory",
    "Trajectory": "biprm.data.trajectory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'biprm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
