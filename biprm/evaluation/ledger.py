"""The ledger of a table: the rows it stands on, the questions behind them, and what --max-length cut.

Per subset (or pool file): the rows read, those the tables stand on, and the distinct questions behind them; per
model: the rows it could not score at all (left out of every table row), the rows whose trailing steps were cut at
--max-length, the steps dropped, and the first errors that lay in the dropped part. Counted from the
scores themselves (their offsets hold the steps scored), so a rerun from the score cache reports the same ledger as a
fresh one."""

from __future__ import annotations

import numpy as np

from biprm.analysis.common import markdown_table
from biprm.data.trajectory import DataError, Trajectory
from biprm.metrics.bootstrap import question_clusters
from biprm.scoring.step_scores import StepScores


def not_scorable(trajs: list[Trajectory], scores: StepScores) -> np.ndarray:
    """Per row, whether it has steps and none was scored: its question and first step alone exceed max_length (a cut
    row always keeps one step), so the scorer passed it by (`evaluation.sharing`)."""
    return (np.diff(scores.offsets) == 0) & (np.array([len(t.steps) for t in trajs]) > 0)


def scorable(trajs: list[Trajectory], scores: dict[str, StepScores]) -> np.ndarray:
    """The rows every model scored: what the tables stand on, so that every row of a table reads the same rows."""
    unscored = [not_scorable(trajs, s) for s in scores.values()]
    return np.flatnonzero(~np.any(unscored, axis=0)) if unscored else np.arange(len(trajs))


def refuse_unscorable(trajs: list[Trajectory], scores: dict[str, StepScores], max_length: int) -> None:
    """--on-overlength refuse: stop at the first row some model could not score, naming its subset, row and model."""
    for key, s in scores.items():
        if (rows := np.flatnonzero(not_scorable(trajs, s))).size:
            t = trajs[rows[0]]
            where = f"{t.meta.get('subset', 'row')} row {t.meta.get('id', rows[0])}"
            raise DataError(
                f"{where}: field 'steps': question and first step need more than --max-length={max_length} tokens "
                f"for {key} ({rows.size} such rows; --on-overlength flag leaves them out of the tables and counts them)"
            )


def cut(trajs: list[Trajectory], scores: StepScores) -> dict:
    """Rows not scorable at all; rows cut, steps dropped and (for labelled rows) first errors in the dropped part."""
    n_steps = np.array([len(t.steps) for t in trajs])
    dropped = (n_steps - np.diff(scores.offsets)) * ~not_scorable(trajs, scores)
    first = np.array([-1 if t.labels is None else t.first_error for t in trajs])  # a pool's candidates: no labels
    return {
        "rows_not_scorable": int(not_scorable(trajs, scores).sum()),
        "rows_cut": int((dropped > 0).sum()),
        "steps_dropped": int(dropped.sum()),
        "first_errors_dropped": int(((first >= 0) & (dropped > 0) & (first >= n_steps - dropped)).sum()),
    }


def ledger(trajs: list[Trajectory], groups: np.ndarray, scores: dict[str, StepScores]) -> dict:
    """{group: {"rows", "in_tables", "questions", "models": {model: `cut`}}} for each group (subset) in order of
    appearance; "in_tables" counts the rows every model could score (`scorable`)."""
    groups, questions = np.asarray(groups), question_clusters([t.question for t in trajs])
    kept = np.isin(np.arange(len(trajs)), scorable(trajs, scores))
    out = {}
    for name in dict.fromkeys(groups.tolist()):
        rows = np.flatnonzero(groups == name)
        part = [trajs[i] for i in rows]
        out[str(name)] = {
            "rows": len(rows),
            "in_tables": int(kept[rows].sum()),
            "questions": len(np.unique(questions[rows])),
            "models": {key: cut(part, s.select(rows)) for key, s in scores.items()},
        }
    return out


LEFT_OUT = {
    "rows": "A row some model cannot score at all (its question and first step alone exceed --max-length) is left out "
    "of every table row, so all of them stand on the same rows; --on-overlength refuse stops on it instead.",
    "candidates": "A candidate some model cannot score at all (its question and first step alone exceed --max-length) "
    "leaves its pool for every table row; --on-overlength refuse stops on it instead.",
}
CUT = {
    "rows": "A cut row's dropped steps are unscored: a first error among them cannot be found, counts as a miss at a "
    "fixed threshold and is left out of threshold tuning.",
    "candidates": "A cut candidate's solution score reads its scored steps only.",
}


COUNTS = ("rows_not_scorable", "rows_cut", "steps_dropped", "first_errors_dropped")


def format_ledger(book: dict, unit: str = "rows") -> str:
    """The ledger as a table: one line per group and model (one per group without models)."""
    lines = []
    for name, g in book.items():
        for model, c in g["models"].items() or [("–", None)]:
            counts = [c.get(k, 0) for k in COUNTS] if c else ["–"] * len(COUNTS)
            lines.append([name, g["rows"], g.get("in_tables", g["rows"]), g["questions"], model, *counts])
    head = [
        "subset",
        f"{unit} read",
        "in the tables",
        "distinct questions",
        "model",
        "not scorable (left out)",
        f"{unit} cut at --max-length",
        "steps dropped",
        "first errors in the dropped part",
    ]
    small = [
        f"{name}: {g['pools_too_small']} of {g['pools']} pools hold fewer than the smallest n asked "
        f"({g['smallest_n']}) in candidates every model scored, and are left out of the tables."
        for name, g in book.items()
        if g.get("pools_too_small")
    ]
    table = markdown_table(head, [[str(x) for x in line] for line in lines], left=5)
    return "\n\n".join(
        [f"Ledger: the {unit} read and those the tables stand on. {LEFT_OUT[unit]} {CUT[unit]}", table, *small]
    )
