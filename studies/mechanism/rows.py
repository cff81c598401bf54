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

Labels (`labels`): version 1 used the first-error convention, 1 before t and 0 from t on
(F and L), which R2L cannot fit on F rows: after t it reads exactly what it reads in the C
twin, labelled 1. Version 2 labels each step by whether it is itself correct ("own"): F is
0 at t only (the later steps are right and reach the right answer), L is 0 from t on (the
slip is carried into every later result). R and C are 1 everywhere in both. t is drawn
uniformly over the eligible steps of each solution, and the wrong value has as many
characters as the right one (version 2: and its roundness class, `roundness`), so neither
position, length nor roundness can tell a corrupted row from its clean twin. The paper's mechanism predicts that on F
rows the R2L stream (and so BiPRM) finds step t while L2R can at best flag t+1; on L rows, that L2R is enough.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np

from biprm.data.perturb import mix_seed
from biprm.data.readers import read_rows
from biprm.data.benchmarks import QUESTION_SETS, SUBPOOLS, data_file, load_processbench, spread
from biprm.evaluation.pools import Pool, load_pool
from studies.mechanism.config import MechanismConfig
from biprm.data.benchmarks import gsm8k_reference
from studies.replication.data import (
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


def roundness(value: Decimal) -> tuple[int, int, bool]:
    """(decimal places, trailing zeros, last non-zero digit is 5) of a value: 24 (0, 0, False), 150 (0, 1, True),
    12.5 (1, 0, True). Version 1 drew wrong values less round than right ones, which a "rounder number" rule read."""
    sign, digits, exponent = abs(value).normalize().as_tuple()
    last = next((d for d in reversed(digits) if d), 0)
    return max(0, -exponent), max(0, exponent), last == 5


def _same_width_wrong(
    value: Decimal, like: str, rng: random.Random, taken: set[Decimal], keep_roundness: bool = False
) -> str | None:
    """A wrong value written with as many characters as `like` (no length cue), or None; a whole
    value written with decimals ("25.00") stays whole, so the cents give nothing away. With
    `keep_roundness` it also has the right value's `roundness`, drawn in steps of its last digit."""
    places = 0 if value == value.to_integral_value() else _places(like)
    if keep_roundness and places == 0:
        places = -roundness(value)[1]  # 150 moves in tens
    for _ in range(50):
        wrong = _wrong(value, places, rng, taken)
        text = _format(wrong, like)
        if len(text) == len(like) and (not keep_roundness or roundness(wrong) == roundness(value)):
            return text
    return None


def eligible_steps(ref: Trajectory) -> dict[int, list[re.Match[str]]]:
    """Step -> results that can carry an F/L pair: fresh, bare-able, and reused in later arithmetic."""
    out: dict[int, list[re.Match[str]]] = {}
    for t, m in _candidates(ref, fresh_only=True):
        if _bare(ref.steps[t], m) and _reused_in_arithmetic(ref.steps[t + 1 :], _value(m.group())):
            out.setdefault(t, []).append(m)
    return out


def row_labels(kind: str, t: int, n: int, labels: str) -> list[float]:
    """Step labels of a row of `kind` with its error at step t of n: "first-error" (version 1) or "own" (version 2)."""
    if kind in "RC":
        return [1.0] * n
    if kind == "F" and labels == "own":
        return [0.0 if k == t else 1.0 for k in range(n)]
    return labels_from_first_error(t, n)


def quadruple(
    ref: Trajectory, rng: random.Random, labels: str = "first-error", keep_roundness: bool = False
) -> list[Trajectory] | None:
    """The R, C, F and L rows of one reference (meta: kind, step, from, to), or None if no step fits."""
    steps = eligible_steps(ref)
    if not steps:
        return None
    t = rng.choice(sorted(steps))  # uniform over steps, then over that step's results
    m = rng.choice(steps[t])
    taken = set(_values(ref.question)).union(*map(_values, ref.steps))
    right = _value(m.group())
    for _ in range(10):
        wrong = _same_width_wrong(right, m.group(), rng, taken, keep_roundness)
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
        meta = {
            **ref.meta,
            "kind": kind,
            "first_error": t if kind in "FL" else -1,
            "step": t,
            "from": m.group(),
            "to": wrong,
        }
        rows.append(replace(ref, steps=list(text[kind]), labels=row_labels(kind, t, n, labels), meta=meta))
    return rows


def _build(
    rows: list[dict], name: str, chosen: list[int], seed: int, split: str, **options
) -> tuple[list[Trajectory], int]:
    out, missing = [], 0
    for i in chosen:
        ref = gsm8k_reference(rows[i].get("question"), rows[i].get("answer"), f"{name} row {i + 1}")
        ref.meta |= {"index": i, "group": f"{split}:{i}", "split": split}
        made = quadruple(ref, random.Random(mix_seed(seed, i)), **options)
        if made is None:
            missing += 1
            continue
        out += made
    return out, missing


def build_mechanism(
    data_root: str, train_questions: int, valid_questions: int, test_questions: int, seed: int = 1106, **options
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
    for split, rows, name, idx in (
        ("train", train_rows, train_name, train_idx),
        ("valid", train_rows, train_name, valid_idx),
        ("test", test_rows, test_name, test_idx),
    ):
        sets[split], missing = _build(
            rows, name, idx, mix_seed(seed, ("train", "valid", "test").index(split)), split, **options
        )
        steps = [r.meta["step"] for r in sets[split] if r.meta["kind"] == "F"]
        report[split] = {
            "questions_tried": len(idx),
            "questions_without_eligible_step": missing,
            "questions": len(steps),
            "rows": len(sets[split]),
            "error_step_histogram": {str(k): steps.count(k) for k in sorted(set(steps))},
            "steps_histogram": _histogram([len(r.steps) for r in sets[split] if r.meta["kind"] == "R"]),
        }
    return sets, report


def _histogram(values: list[int]) -> dict[str, int]:
    return {str(k): values.count(k) for k in sorted(set(values))}


def _subpools(pool: Pool) -> dict[str, Pool]:
    """Each style's candidates of every question, as a pool of its own."""
    cand = np.array([t.meta["cand"] for t in pool.trajs])
    out = {}
    for name, keep in SUBPOOLS.items():
        idx = np.flatnonzero(np.isin(cand, keep))
        out[name] = Pool(
            f"{pool.name}:{name}", [pool.trajs[i] for i in idx], pool.qid[idx], pool.correct[idx], pool.answer_key[idx]
        )
    return out


def scores_path(cfg: MechanismConfig, name: str) -> Path:
    """A run's per-item step logits, beside its JSON: a few hundred kB, committed with the results."""
    return Path(cfg.out) / "runs" / f"{name}.npz"


def load_sets(cfg: MechanismConfig) -> tuple[dict[str, list[Trajectory]], dict[str, Pool], dict]:
    """(trajectories per set, the BoN sub-pools, the data report); the set "bon" holds every sub-pool's candidates."""
    rows, report = build_mechanism(
        cfg.data_root,
        cfg.train_questions,
        cfg.valid_questions,
        cfg.test_questions,
        cfg.data_seed,
        labels=cfg.labels,
        keep_roundness=cfg.keep_roundness,
    )
    pool = load_pool("gsm8k_bon_small", cfg.data_root, cfg.bon_questions)
    keep = np.isin([t.meta["cand"] for t in pool.trajs], sum(SUBPOOLS.values(), ()))
    pool = Pool(
        pool.name, [t for t, k in zip(pool.trajs, keep) if k], pool.qid[keep], pool.correct[keep], pool.answer_key[keep]
    )
    sets = {
        **rows,
        "processbench": load_processbench(cfg.data_root, ("gsm8k",), cfg.processbench_rows),
        "bon": pool.trajs,
    }
    report["processbench_gsm8k_rows"] = len(sets["processbench"])
    report["bon"] = {"questions": len(np.unique(pool.qid)), "candidates": len(pool.trajs)}
    return sets, {"all": pool, **_subpools(pool)}, report
