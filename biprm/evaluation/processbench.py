"""ProcessBench: find the first wrong step (or say there is none) in 3,400 labelled solutions.

Prediction = the first step whose fused probability is below the threshold, else −1.
Scores per subset: accuracy on erroneous rows (exact index), on clean rows (−1), and
their harmonic mean F1; the headline is the mean F1 over subsets. The threshold is 0.5
(the reference code's) or, with `tune`, chosen per mode on the GSM8K subset and applied
to every subset, as ProcessBench's authors do for scalar PRMs; both are reported.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from biprm.analysis.common import TITLES, first_error_report, first_errors, judged_rows, markdown_table, subsets
from biprm.evaluation.common import EvalOptions, fmt, write_outputs
from biprm.config import PROCESSBENCH_SUBSETS
from biprm.evaluation.data import load_processbench
from biprm.evaluation.models import modes_of, score_modes
from biprm.metrics.processbench import first_error_f1_by_subset, tune_threshold
from biprm.scores import StepScores
from biprm.trajectory import Trajectory

TUNE_ON = "gsm8k"


@dataclass(kw_only=True)
class ProcessBenchConfig(EvalOptions):
    models: list[str]
    subsets: tuple[str, ...] = PROCESSBENCH_SUBSETS
    threshold: float = 0.5
    tune: bool = False


def tuned_threshold(trajs: list[Trajectory], scores: StepScores) -> tuple[float, float]:
    """(threshold, its F1) on the GSM8K rows; a row whose first error lies in steps cut at max_length is left out."""
    rows = np.flatnonzero(subsets(trajs) == TUNE_ON)
    if not len(rows):
        raise ValueError(f"threshold tuning uses the {TUNE_ON} subset; include it in the subsets")
    part, first = judged_rows([trajs[i] for i in rows], scores.select(rows))
    return tune_threshold(part.prob(), part.offsets, first)


def evaluate_processbench(trajs: list[Trajectory], scores: dict[str, StepScores], threshold: float = 0.5, tune: bool = False) -> dict:
    """Per mode: "fixed" (at `threshold`) and, with `tune`, "tuned" ({threshold, tuning_f1, ...}) reports."""
    modes = {}
    for key, s in scores.items():
        modes[key] = {"fixed": first_error_report(trajs, s, threshold)}
        if tune:
            t, f1 = tuned_threshold(trajs, s)
            modes[key]["tuned"] = {"threshold": t, "tuning_f1": f1, **first_error_report(trajs, s, t)}
    names = list(dict.fromkeys(subsets(trajs)))
    first, where = first_errors(trajs), subsets(trajs)
    baselines = {  # what a verifier must beat: flag nothing, or flag every solution at its first step
        "always -1 (no error)": first_error_f1_by_subset(np.full(len(trajs), -1), first, where),
        "always step 0": first_error_f1_by_subset(np.zeros(len(trajs), dtype=np.int64), first, where),
    }
    return {"threshold": threshold, "subsets": names, "rows": {n: int((where == n).sum()) for n in names}, "modes": modes, "baselines": baselines}


def format_processbench(result: dict) -> str:
    """F1 per subset at the fixed and the tuned threshold, then the two accuracies behind each F1."""
    names, modes = result["subsets"], result["modes"]
    heads = [TITLES.get(n, n) for n in names]
    f1_row = lambda r: [fmt(r["subsets"][n]["f1"]) for n in names] + [fmt(r["average_f1"])]  # noqa: E731
    rows = [[f"{key} @ {result['threshold']:g}", *f1_row(m["fixed"])] for key, m in modes.items()]
    rows += [[f"{key} @ {m['tuned']['threshold']:.3f} (tuned on GSM8K)", *f1_row(m["tuned"])] for key, m in modes.items() if "tuned" in m]
    rows += [[f"baseline: {key}", *f1_row(b)] for key, b in result.get("baselines", {}).items()]
    both = lambda s: f"{fmt(s['acc_error'])} / {fmt(s['acc_correct'])}"  # noqa: E731
    acc = [[f"{key} @ {result['threshold']:g}", *(both(m["fixed"]["subsets"][n]) for n in names)] for key, m in modes.items()]
    acc += [[f"baseline: {key}", *(both(b["subsets"][n]) for n in names)] for key, b in result.get("baselines", {}).items()]
    sizes = ", ".join(f"{TITLES.get(n, n)} {k}" for n, k in result["rows"].items())
    return (f"Rows: {sizes}. F1 (%):\n\n" + markdown_table(["mode", *heads, "Avg. F1"], rows)
            + "\n\nAccuracy on erroneous / clean rows (%):\n\n" + markdown_table(["mode", *heads], acc))


def run_processbench(cfg: ProcessBenchConfig) -> dict:
    cache = cfg.open_cache()
    trajs = load_processbench(cfg.data_root, cfg.subsets, cfg.limit)
    result = evaluate_processbench(trajs, score_modes(modes_of(cfg.models), cache, trajs), cfg.threshold, cfg.tune)
    markdown = "# ProcessBench\n\n" + format_processbench(result) + "\n"
    print(markdown)
    print(f"wrote {write_outputs(cfg.out, 'processbench', result, markdown)} and processbench.json")
    return result
