"""Scores -> JSONL, one line per trajectory, ready for any downstream tool."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from biprm.aggregate import AGGREGATIONS, sigmoid
from biprm.scores import StepScores
from biprm.trajectory import Trajectory

STREAMS = ("l2r", "r2l", "sigma", "fused")


def score_rows(trajs: list[Trajectory], scores: StepScores, digits: int | None = 6) -> Iterator[dict]:
    """One dict per trajectory, the same keys whatever the mode: a stream the model lacks is null.

    The input travels with its scores (question, steps, labels, answer, correct, meta with
    any extra input fields), so the output joins back by content, not by line order.
    `steps_scored` < len(steps) when steps past max_length were not scored. Step scores
    are probabilities rounded to `digits` (None: kept whole); `solution` holds each
    aggregation's probability and `solution_logit` its logit, which ranks candidates whose
    probabilities round to the same float (Best-of-N from this file should sort by it).
    """
    logits = {how: scores.solution_logits(how) for how in AGGREGATIONS}
    solution = {how: sigmoid(x) for how, x in logits.items()}
    step = float if digits is None else lambda x: round(float(x), digits)
    for i, traj in enumerate(trajs):
        row = {"question": traj.question, "steps": traj.steps, "labels": traj.labels, "answer": traj.answer, "correct": traj.correct, "meta": traj.meta}
        row |= {s: None if getattr(scores, s) is None else [step(x) for x in scores.of(i, s)] for s in STREAMS}
        row["solution"] = {how: float(solution[how][i]) for how in AGGREGATIONS}
        row["solution_logit"] = {how: float(logits[how][i]) for how in AGGREGATIONS}
        row["steps_scored"] = int(scores.offsets[i + 1] - scores.offsets[i])
        yield row


def write_trajectories(path: str | Path, trajs: list[Trajectory]) -> Path:
    """Labelled trajectories as TRL stepwise-supervision JSONL (`prompt`, `completions`, `labels`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for traj in trajs:
            labels = [bool(x) if x in (0, 1) else float(x) for x in traj.labels]
            f.write(json.dumps({"prompt": traj.question, "completions": traj.steps, "labels": labels}) + "\n")
    return path
