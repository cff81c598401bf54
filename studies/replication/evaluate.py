"""The replication's evaluation sets and the metrics of one trained run.

Sets: the validation split (for choices such as the gate study; never the test sets),
ProcessBench (first wrong step), PRMBench's own 400-item test subset (PRMScore per
error class) and the gsm8k_bon_small Best-of-N pool. Every set is cut to the preset's
size with evenly spaced rows, so the same rows are used by every mode and seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from biprm.scoring.aggregate import log_sigmoid
from biprm.analysis import long_chain_bon, long_chain_processbench, mae_by_position, sigma_by_position
from biprm.analysis.common import judged_rows, scored_part, step_labels
from biprm.data.encoding import Encoded
from biprm.evaluation.bon import evaluate_bon
from biprm.data.benchmarks import data_file, load_processbench, spread
from biprm.evaluation.pools import Pool, load_pool
from biprm.evaluation.processbench import evaluate_processbench
from biprm.metrics.first_error import predict_first_error, processbench_scores
from biprm.metrics.bootstrap import question_clusters
from biprm.metrics.prmbench import (
    prm_score_by_class,
    prm_score_intervals,
    prmbench_category_scores,
    prmbench_classes,
    prmbench_keep,
    prmbench_step_labels,
)
from biprm.analysis.plots import normalised_position
from biprm.data.readers import load_trajectories
from biprm.data.trajectory import Trajectory
from studies.replication.config import ReplicateConfig
from biprm.scoring.step_scores import StepScores


PRMBENCH_SUBSET = "prmbench/subset400_target_data.jsonl.gz"
BON_NS = (2, 4, 8, 12)  # gsm8k_bon_small has 12 candidates per question


@dataclass
class EvalSets:
    valid: list[Trajectory]
    processbench: list[Trajectory]
    prmbench: list[Trajectory]
    bon: Pool

    def trajectories(self) -> dict[str, list[Trajectory]]:
        return {
            "valid": self.valid,
            "processbench": self.processbench,
            "prmbench": self.prmbench,
            "bon": self.bon.trajs,
        }


def load_eval_sets(cfg: ReplicateConfig, valid: list[Trajectory]) -> EvalSets:
    root = cfg.data_root
    processbench = load_processbench(root, cfg.processbench_subsets, cfg.processbench_rows)
    bon = load_pool("gsm8k_bon_small", root, cfg.bon_questions)
    return EvalSets(valid, processbench, load_prmbench(root, cfg.prmbench_rows), bon)


def load_prmbench(root: str, rows: int | None) -> list[Trajectory]:
    """PRMBench's own test subset, malformed processes left out, cut to `rows` evenly spaced over the classes."""
    return read_prmbench(root, rows)[0]


def read_prmbench(root: str, rows: int | None) -> tuple[list[Trajectory], dict]:
    """`load_prmbench`'s processes and its ledger: the processes read, those left out by reason (a repeat of a (class,
    idx) the reference scores once, past --prmbench-rows), and those kept."""
    every = load_trajectories(str(data_file(root, PRMBENCH_SUBSET)), fmt="prmbench")
    keep = prmbench_keep(every)
    kept = [t for t, k in zip(every, keep) if k]
    chosen = spread(len(kept), rows)
    book = {
        "processes_read": len(every),
        "repeats_left_out": int((~keep).sum()),
        "past_prmbench_rows": len(kept) - len(chosen),
        "processes": len(chosen),
    }
    return [kept[i] for i in chosen], book


def prmbench_report(trajs: list[Trajectory], s: StepScores) -> dict:
    """PRMScore per class and category, and per class a 95 % interval over questions (`prm_score_intervals`: a
    question's original and modified processes drawn together); steps cut off by max_length are not counted."""
    n_steps = np.array([len(t.steps) for t in trajs])
    labels = scored_part(prmbench_step_labels(trajs), n_steps, s.offsets)
    classes, questions = prmbench_classes(trajs), question_clusters([t.question for t in trajs])
    by_class = prm_score_by_class(s.prob(), s.offsets, labels, classes)
    return {
        "classes": by_class,
        "categories": prmbench_category_scores(by_class),
        "intervals": prm_score_intervals(s.prob(), s.offsets, labels, classes, questions),
        "questions": int(questions.max()) + 1 if len(trajs) else 0,
        "steps_not_scored": int(n_steps.sum() - len(labels)),
    }


def sigma_histograms(scores: StepScores, position_bins: int = 5, sigma_bins: int = 10) -> dict:
    """Share of steps in each σ bin, per bin of normalised step position: is the gate flat or does it move?"""
    pos = np.minimum((normalised_position(scores.offsets) * position_bins).astype(int), position_bins - 1)
    sig = np.minimum((scores.sigma * sigma_bins).astype(int), sigma_bins - 1)
    counts = np.bincount(pos * sigma_bins + sig, minlength=position_bins * sigma_bins).reshape(
        position_bins, sigma_bins
    )
    share = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    return {
        "position": ((np.arange(position_bins) + 0.5) / position_bins).tolist(),
        "sigma_edges": np.linspace(0, 1, sigma_bins + 1).tolist(),
        "share": share.tolist(),
        "count": counts.sum(1).tolist(),
    }


def _valid_report(trajs: list[Trajectory], s: StepScores) -> dict:
    """Validation BCE of the fused probabilities and first-error F1 at 0.5: what choices are made on."""
    labels = step_labels(trajs, s.offsets)
    bce = float(-np.mean(labels * log_sigmoid(s.fused) + (1 - labels) * log_sigmoid(-s.fused)))
    part, first = judged_rows(trajs, s)
    report = processbench_scores(predict_first_error(part.prob(), part.offsets, 0.5), first)
    return {"bce": bce, **report}


def evaluate_run(
    cfg: ReplicateConfig, mode: str, sets: EvalSets, scores: dict[str, StepScores], encs: dict[str, list[Encoded]]
) -> dict:
    """Every metric of one model; `scores` are its StepScores per set (names of `EvalSets.trajectories`)."""
    pb, bon = scores["processbench"], scores["bon"]
    one = lambda s: {mode: s}  # noqa: E731  the shared evaluators take {mode: scores}
    lengths = {name: np.array([e.n_tokens for e in encs[name]]) for name in ("processbench", "bon")}
    result = {
        "valid": _valid_report(sets.valid, scores["valid"]),
        "processbench": evaluate_processbench(
            sets.processbench, one(pb), 0.5, tune="gsm8k" in cfg.processbench_subsets
        )["modes"][mode],
        "prmbench": prmbench_report(sets.prmbench, scores["prmbench"]),
        "bon": evaluate_bon(sets.bon, one(bon), "min", BON_NS)["modes"][mode],
        "mae_by_position": mae_by_position(sets.processbench, one(pb))["curves"][mode],
        "long_chain": {
            "processbench": long_chain_processbench(
                sets.processbench, one(pb), lengths["processbench"], cfg.long_chain_tokens
            ),
            "bon": long_chain_bon(
                sets.bon.qid, sets.bon.correct, one(bon), lengths["bon"], cfg.long_chain_tokens, BON_NS
            ),
        },
    }
    if mode == "bi":
        result["sigma_by_position"] = sigma_by_position(pb)["curve"]
        result["sigma_histograms"] = sigma_histograms(pb)
    return result
