"""Best-of-N pools as the protocols consume them: candidates graded against their golds, with vote keys.

The candidates come from the data wing (`biprm.data.benchmarks`); here each is graded with
math-verify where its gold is known, and grades are kept in the score cache.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from biprm.data.benchmarks import load_candidates
from biprm.data.segment import Segmenter
from biprm.data.trajectory import DataError, Trajectory
from biprm.evaluation.cache import ScoreCache
from biprm.evaluation.grading import extract_answer, grade_many

logger = logging.getLogger(__name__)


@dataclass
class Pool:
    """Candidates flat and grouped by question, with what every BoN metric needs besides scores."""

    name: str
    trajs: list[Trajectory]
    qid: np.ndarray
    correct: np.ndarray
    answer_key: np.ndarray


def answer_key(answer: str | None, i: int) -> str:
    """A vote key: the extracted answer without spacing or sizing commands; an unparsed answer votes alone."""
    if answer is None:
        return f"<no answer {i}>"
    for noise in (" ", "\\left", "\\right", "\\!", "\\,", "\\displaystyle"):
        answer = answer.replace(noise, "")
    return answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def load_pool(
    spec: str,
    data_root: str,
    limit: int | None = None,
    questions: str | None = None,
    questions_split: str = "test",
    split_rule: str | Segmenter = "auto",
    cache: ScoreCache | None = None,
    grade_workers: int = 2,
    grade_timeout: float = 5.0,
) -> Pool:
    """A pool with correctness per candidate: math-verify against the gold wherever the gold is known,
    the stored flag only where it is not.

    Stored flags can be wrong (27 of gsm8k_bon_small's: golds stored as 'None', rounded MetaMath answers,
    docs/EVALUATION.md), so a flag the grader disagrees with is overruled, and the count is logged. A grade
    that timed out falls back to the stored flag (else counts as incorrect) in this run, is reported, and is
    graded again on the next run (the cache keeps -1 for it, never a verdict)."""
    trajs, name, spec = load_candidates(spec, data_root, limit, questions, questions_split, split_rule)

    preds = [
        extract_answer("\n".join(t.steps), t.question) for t in trajs
    ]  # the question decides "7 dozen" (docs/EVALUATION.md)
    if any(t.answer is None and t.correct is None for t in trajs):
        raise DataError(
            f"{spec}: candidates have no stored 'correct' flag and no gold answer; name the questions as "
            f"{spec}@QUESTIONS"
        )
    known = np.array([i for i, t in enumerate(trajs) if t.answer is not None], dtype=np.int64)
    pairs = [(trajs[i].answer, preds[i]) for i in known]
    graded = np.zeros(0, dtype=np.int8)
    if pairs:

        def grade() -> np.ndarray:
            return np.array(
                [-1 if v is None else int(v) for v in grade_many(pairs, grade_workers, grade_timeout)], dtype=np.int8
            )

        if cache is None:
            graded = grade()
        else:
            graded = cache.array(
                "grades", None, [trajs[i] for i in known], repr(pairs), grade, retry=lambda v: bool((v == -1).any())
            )
        if timed_out := int((graded == -1).sum()):
            logger.warning(
                "%s: %d candidates could not be graded within %g s; their stored flag (else 'incorrect') is used in "
                "this run and they are graded again on the next (raise --grade-timeout to give them longer)",
                name,
                timed_out,
                grade_timeout,
            )
    correct = np.array([bool(t.correct) for t in trajs])
    done = known[graded != -1]
    verdicts = graded[graded != -1] == 1
    overruled = sum(trajs[i].correct is not None and trajs[i].correct != v for i, v in zip(done, verdicts))
    if overruled:
        logger.warning("%s: the grader overrules %d stored correctness flags (docs/EVALUATION.md)", name, overruled)
    correct[done] = verdicts
    keys = np.array([answer_key(a, i) for i, a in enumerate(preds)])
    return Pool(name, trajs, np.array([t.meta["qid"] for t in trajs]), correct, keys)
