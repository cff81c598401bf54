"""The paper's analyses (Section 5 and appendices) as pure functions returning JSON-ready dicts.

Every function that takes `scores: dict[str, StepScores]` expects all modes scored over
the same items in the same order. Dict keys that are n (BoN) are ints; NaN marks a
number with nothing to measure, as elsewhere in biprm.metrics.
"""

from biprm.analysis.aggregation import aggregation_table, bon_by_n, format_aggregation_table
from biprm.analysis.cases import case_studies, pick_cases
from biprm.analysis.long_chain import long_chain_bon, long_chain_processbench
from biprm.analysis.plots import plot_mae_by_position, plot_sigma_by_position
from biprm.analysis.position import error_onset, mae_by_position, sigma_by_position
from biprm.analysis.robustness import format_perturbation_table, perturbation_robustness

__all__ = [
    "aggregation_table",
    "bon_by_n",
    "case_studies",
    "error_onset",
    "format_aggregation_table",
    "format_perturbation_table",
    "long_chain_bon",
    "long_chain_processbench",
    "mae_by_position",
    "perturbation_robustness",
    "pick_cases",
    "plot_mae_by_position",
    "plot_sigma_by_position",
    "sigma_by_position",
]
