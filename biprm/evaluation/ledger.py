"""The ledger of a table: the rows it stands on, the questions behind them, and what --max-length cut.

Per subset (or pool file): the rows read and the distinct questions behind them; per model: the rows whose trailing
steps were cut at --max-length, the steps dropped, and the first errors that lay in the dropped part. Counted from the
scores themselves (their offsets hold the steps scored), so a rerun from the score cache reports the same ledger as a
fresh one."""

from __future__ import annotations

import numpy as np

from biprm.analysis.common import markdown_table
from biprm.data.trajectory import Trajectory
from biprm.metrics.bootstrap import question_clusters
from biprm.scoring.step_scores import StepScores


def cut(trajs: list[Trajectory], scores: StepScores) -> dict:
    """Rows cut, steps dropped and (for labelled rows) first errors in the dropped part."""
    n_steps = np.array([len(t.steps) for t in trajs])
    dropped = n_steps - np.diff(scores.offsets)
    first = np.array([-1 if t.labels is None else t.first_error for t in trajs])  # a pool's candidates: no labels
    return {
        "rows_cut": int((dropped > 0).sum()),
        "steps_dropped": int(dropped.sum()),
        "first_errors_dropped": int(((first >= 0) & (first >= n_steps - dropped)).sum()),
    }


def ledger(trajs: list[Trajectory], groups: np.ndarray, scores: dict[str, StepScores]) -> dict:
    """{group: {"rows", "questions", "models": {model: `cut`}}} for each group (subset) in order of appearance."""
    groups, questions = np.asarray(groups), question_clusters([t.question for t in trajs])
    out = {}
    for name in dict.fromkeys(groups.tolist()):
        rows = np.flatnonzero(groups == name)
        part = [trajs[i] for i in rows]
        out[str(name)] = {
            "rows": len(rows),
            "questions": len(np.unique(questions[rows])),
            "models": {key: cut(part, s.select(rows)) for key, s in scores.items()},
        }
    return out


CUT = {
    "rows": "A cut row's dropped steps are unscored: a first error among them cannot be found, counts as a miss at a "
    "fixed threshold and is left out of threshold tuning.",
    "candidates": "A cut candidate's solution score reads its scored steps only.",
}


def format_ledger(book: dict, unit: str = "rows") -> str:
    """The ledger as a table: one line per group and model (one per group without models)."""
    lines = []
    for name, g in book.items():
        for model, c in g["models"].items() or [("–", None)]:
            counts = [c["rows_cut"], c["steps_dropped"], c["first_errors_dropped"]] if c else ["–"] * 3
            lines.append([name, g["rows"], g["questions"], model, *counts])
    head = [
        "subset",
        f"{unit} read",
        "distinct questions",
        "model",
        f"{unit} cut at --max-length",
        "steps dropped",
        "first errors in the dropped part",
    ]
    return f"Ledger: every one of the {unit} read is in the tables. {CUT[unit]}\n\n" + markdown_table(
        head, [[str(x) for x in line] for line in lines], left=4
    )
