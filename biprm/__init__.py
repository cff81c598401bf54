"""biprm: Bidirectional Process Reward Models.

Data flows one way: raw rows -> Trajectory (readers) -> encoded L2R/R2L pieces
(encoding) -> one packed batch (packing) -> per-step outputs (modeling) -> solution
scores (aggregate) -> metrics and reports (metrics, analysis, evaluation).
"""
from biprm.modeling import BiPRMConfig, BiPRMModel, from_backbone
from biprm.scores import StepScores
from biprm.scoring import Scorer
from biprm.train import TrainConfig, train
from biprm.trajectory import DataError, Trajectory

__all__ = ["BiPRMConfig", "BiPRMModel", "DataError", "Scorer", "StepScores", "TrainConfig", "Trajectory", "from_backbone", "train"]
__version__ = "0.1.0"
