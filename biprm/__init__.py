"""biprm: Bidirectional Process Reward Models.

Data flows one way: raw rows -> Trajectory (readers) -> encoded L2R/R2L pieces
(encoding) -> one packed batch (packing) -> per-step outputs (modeling) -> solution
scores (aggregate) -> metrics and reports (metrics, analysis, evaluation).

The names below load on first use, so `biprm --help` does not pay for torch.
`import biprm.modeling` registers the architecture with `AutoModel`. `train` shares its
name with its module: once the module `biprm.train` is imported, `biprm.train` is that
module, so import the function as `from biprm.train import train` in such code.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "BiPRMConfig": "biprm.modeling", "BiPRMModel": "biprm.modeling", "from_backbone": "biprm.modeling",
    "StepScores": "biprm.scores", "Scorer": "biprm.scoring", "TrainConfig": "biprm.config", "train": "biprm.train",
    "BiPRMTrainer": "biprm.train",
    "DataError": "biprm.trajectory", "Trajectory": "biprm.trajectory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'biprm' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    # all of the module's exports at once: importing biprm.train just bound the module over the function `train`
    globals().update({n: getattr(module, n) for n, home in _EXPORTS.items() if home == module.__name__})
    return globals()[name]
