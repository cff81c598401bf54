"""The controlled test of the paper's mechanism: errors that only the future reveals.

From one GSM8K reference solution and one of its steps t whose result later steps reuse
in explicit arithmetic, four rows that differ only at step t (and, for L, after it):

    R  the reference: "Natalia sold 48/2 = 24 clips in May."
    C  step t states its result without the arithmetic: "Natalia sold 24 clips in May."
    F  the same bare statement with a wrong value ("... sold 30 clips ..."), while later
       steps keep using the right one ("48+24 = 72"): the error shows only when step t
       is read against the steps after it.
    L  a visible slip ("48/2 = 30") that later steps carry consistently ("48+30 = 78"):
       step t is wrong on its own, and the future adds nothing.

Labels follow the first-error convention: 1 before t, 0 from t on (F and L), 1 everywhere
(R and C). t is drawn uniformly over the eligible steps of each solution, and the wrong
value has as many characters as the right one, so neither position nor length can tell
a corrupted row from its clean twin. The paper's mechanism predicts that on F rows the
R2L stream (and so BiPRM) finds step t while L2R can at best flag t+1; on L rows, that
L2R is enough.
"""
from __future__ import annotations

import random
import re
from dataclasses import replace
from decimal import Decimal

from biprm.data.perturb import mix_seed
from biprm.data.readers import read_rows
from biprm.evaluation.data import QUESTION_SETS, data_file, spread
from biprm.replication.data import (
    _AFTER_EQUALS,
    _arithmetic,
    _candidates,
    _carry,
    _format,
    _places,
    _results,
    _value,
    _values,
    _wrong,
    evaluation_questions,
    gsm8k_reference,
    normalise,
)
from biprm.data.trajectory import Trajectory, labels_from_first_error

KINDS = ("R", "C", "F", "L")
# The arithmetic right before an "=": digits, money, operators and spaces only ("48/2 ", "$12 x 5 ").
_EXPRESSION = re.compile(r"[\d$(][\d$.,()+\-*/x×÷%\s]*\Z")
_OPERATOR = re.compile(r"(?<=[\d)\s])[+\-*/x×÷](?=[\s\d$(.])")


def _bare(step: str, result: re.Match[str]) -> tuple[int, int] | None:
    """(start, end) of "EXPR = " before `result` when EXPR is pure arithmetic that gives it, else None.

    Removing that span leaves the step stating the result alone.
    """
    span = _arithmetic(step, result)
    if span is None:
        return None
    found = _EXPRESSION.search(step, span[0], span[1])
    if found is None or not _OPERATOR.search(found.group()):
        return None
    after = span[1] + 1
    while after < result.start() and step[after] == " ":
        after += 1
    return found.start(), after


def _reused_in_arithmetic(later: list[str], value: Decimal) -> bool:
    """Some later step computes with `value` as an operand, so a bare wrong claim of it is contradicted."""
    for step in later:
        for m in _results(step):
            span = _arithmetic(step, m) if _AFTER_EQUALS.search(step, 0, m.start()) else None
            if span and value in _values(step[span[0] : span[1]]):
                return True
    return False


def _same_width_wrong(value: Decimal, like: str, rng: random.Random, taken: set[Decimal]) -> str | None:
    """A wrong value written with as many characters as `like` (no length cue), or None; a whole
    value written with decimals ("25.00") stays whole, so the cents give nothing away."""
    places = 0 if value == value.to_integral_value() else _places(like)
    for _ in range(50):
        text = _format(_wrong(value, places, rng, taken), like)
        if len(text) == len(like):
            return text
    return None


def eligible_steps(ref: Trajectory) -> dict[int, list[re.Match[str]]]:
    """Step -> results that can carry an F/L pair: fresh, bare-able, and reused in later arithmetic."""
    out: dict[int, list[re.Match[str]]] = {}
    for t, m in _candidates(ref, fresh_only=True):
        if _bare(ref.steps[t], m) and _reused_in_arithmetic(ref.steps[t + 1 :], _value(m.group())):
            out.setdefault(t, []).append(m)
    return out


def quadruple(ref: Trajectory, rng: random.Random) -> list[Trajectory] | None:
    """The R, C, F and L rows of one reference (meta: kind, step, from, to), or None if no step fits."""
    steps = eligible_steps(ref)
    if not steps:
        return None
    t = rng.choice(sorted(steps))  # uniform over steps, then over that step's results
    m = rng.choice(steps[t])
    taken = set(_values(ref.question)).union(*map(_values, ref.steps))
    right = _value(m.group())
    for _ in range(10):
        wrong = _same_width_wrong(right, m.group(), rng, taken)
        if wrong is None:
            return None
        mapping = {right: _value(wrong)}  # grows as each later result is recomputed
        later = [_carry(s, mapping) for s in ref.steps[t + 1 :]]
        if not any(v < 0 for s in later for v in _values(s)) and later != ref.steps[t + 1 :]:
            break
    else:
        return None
    step = ref.steps[t]
    cut = _bare(step, m)
    slipped = step[: m.start()] + wrong + step[m.end() :]
    text = {
        "R": ref.steps,
        "C": [*ref.steps[:t], step[: cut[0]] + step[cut[1] :], *ref.steps[t + 1 :]],
        "F": [*ref.steps[:t], slipped[: cut[0]] + slipped[cut[1] :], *ref.steps[t + 1 :]],
        "L": [*ref.steps[:t], slipped, *later],
    }
    n = len(ref.steps)
    rows = []
    for kind in KINDS:
        first = t if kind in "FL" else -1
        labels = labels_from_first_error(first, n) if first >= 0 else [1.0] * n
        meta = {**ref.meta, "kind": kind, "first_error": first, "step": t, "from": m.group(), "to": wrong}
        rows.append(replace(ref, steps=list(text[kind]), labels=labels, meta=meta))
    return rows


def _build(rows: list[dict], name: str, chosen: list[int], seed: int, split: str) -> tuple[list[Trajectory], int]:
    out, missing = [], 0
    for i in chosen:
        ref = gsm8k_reference(rows[i].get("question"), rows[i].get("answer"), f"{name} row {i + 1}")
        ref.meta |= {"index": i, "group": f"{split}:{i}", "split": split}
        made = quadruple(ref, random.Random(mix_seed(seed, i)))
        if made is None:
            missing += 1
            continue
        out += made
    return out, missing


def build_mechanism(
    data_root: str, train_questions: int, valid_questions: int, test_questions: int, seed: int = 1106
) -> tuple[dict[str, list[Trajectory]], dict]:
    """{"train", "valid", "test"} rows and a report of the counts.

    Train and valid are GSM8K-train questions (valid: every k-th of those kept), with every
    question found in an evaluation set removed; test is GSM8K test, the questions of
    ProcessBench's GSM8K subset and of the Best-of-N pool, so it is scored but never tuned on.
    """
    train_rows, train_name = read_rows(str(data_file(data_root, "gsm8k", "train.jsonl.gz")))
    evals = evaluation_questions(data_root)
    blocked = set().union(*evals.values())
    clean = [i for i, row in enumerate(train_rows) if normalise(str(row.get("question", ""))) not in blocked]
    picked = [clean[i] for i in spread(len(clean), train_questions + valid_questions)]
    every = max(1, len(picked) // max(valid_questions, 1))
    valid_idx = picked[::every][:valid_questions]
    train_idx = [i for i in picked if i not in set(valid_idx)]
    test_rows, test_name = read_rows(str(data_file(data_root, QUESTION_SETS["gsm8k"])))
    test_idx = spread(len(test_rows), test_questions).tolist()
    sets, report = {}, {"gsm8k_train_removed_as_evaluation": len(train_rows) - len(clean), "seed": seed}
    for split, rows, name, idx in (("train", train_rows, train_name, train_idx), ("valid", train_rows, train_name, valid_idx),
                                   ("test", test_rows, test_name, test_idx)):
        sets[split], missing = _build(rows, name, idx, mix_seed(seed, ("train", "valid", "test").index(split)), split)
        steps = [r.meta["step"] for r in sets[split] if r.meta["kind"] == "F"]
        report[split] = {"questions_tried": len(idx), "questions_without_eligible_step": missing, "questions": len(steps),
                         "rows": len(sets[split]), "error_step_histogram": {str(k): steps.count(k) for k in sorted(set(steps))},
                         "steps_histogram": _histogram([len(r.steps) for r in sets[split] if r.meta["kind"] == "R"])}
    return sets, report


def _histogram(values: list[int]) -> dict[str, int]:
    return {str(k): values.count(k) for k in sorted(set(values))}
