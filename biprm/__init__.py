"""biprm: Bidirectional Process Reward Models.

Data flows one way: raw rows -> Trajectory (readers) -> encoded L2R/R2L pieces
(encoding) -> one packed batch (packing) -> per-step outputs (modeling) -> solution
scores (aggregate) -> metrics and reports (metrics, analysis, evaluation).

The names below load on first use, so `biprm --help` does not pay for torch.
`import biprm.modeling` registers the architecture with `AutoModel`.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "BiPRMConfig": "biprm.modeling", "BiPRMModel": "biprm.modeling", "from_backbone": "biprm.modeling",
    "StepScores": "biprm.scores", "Scorer": "biprm.scoring", "TrainConfig": "biprm.configs", "train": "biprm.train",
    "DataError": "biprm.trajectory", "Trajectory": "biprm.trajectory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'biprm' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
