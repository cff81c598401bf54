"""Training data for the replication: PRMBench-train plus corrupted GSM8K-train references.

The paper trains on Math-Shepherd, which is not on hand. Two real step-labelled sources
stand in: PRMBench's GPT-4o-injected errors on PRM800K training problems (each with its
clean twin), and GSM8K reference solutions (all steps right) with one number made wrong.
Labels follow ProcessBench: 1 before the first wrong step, 0 from it on.

Every problem with a question text (after `normalise`) found in an evaluation set is
removed, and the train/valid split is by problem, so none sits on both sides.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Callable

from biprm.config import PROCESSBENCH_SUBSETS
from biprm.data.perturb import mix_seed
from biprm.data.readers import load_trajectories, read_rows
from biprm.data.trajectory import Trajectory, labels_from_first_error
from biprm.data.writer import write_trajectories
from biprm.data.benchmarks import QUESTION_SETS, data_file, gsm8k_reference, spread
from studies.replication.config import DataRecipe

# A number as written in a solution: 24, 3.5, .25, 1,250. Never a piece of a longer number
# (24 in 124 or 2.24), nor an ordinal (3rd); "12x2" still yields 12 and 2.
_NUMBER = re.compile(
    r"(?<![\d.,])(?<![A-Za-wyz])(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d|[.,]\d|st\b|nd\b|rd\b|th\b)"
)
_AFTER_EQUALS = re.compile(r"=\s*\$?\s*\Z")  # the text before a result ends in "=" (or "= $")
# Arithmetic as GSM8K writes it: "12 x $2", "30 snakes * 3 birds/snake", "20 - 4 – 3", "40%".
_TIMES = re.compile(r"(?<=[\d\s)])[x×](?=\s*[\d$(.])")
_UNIT = re.compile(r"/\s*[^\W\d_]+")  # a unit's denominator, "/snake"
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")  # "push-ups", "Carolyn's"
_SYMBOLS = str.maketrans({"$": " ", "÷": "/", "–": "-", "−": "-", "%": "/100"})
_START = re.compile(r"(?<![\d.])(?:[\d(]|-(?=\d))")  # where an arithmetic run may begin
_OPERATORS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


@dataclass
class DataReport:
    """Counts for the docs: what was read, what each filter removed, what is left."""

    recipe: dict
    prmbench_rows_read: int = 0  # trajectories that passed validation (originals and modified)
    prmbench_duplicates: int = 0
    prmbench_rows: int = 0  # after the cap
    gsm8k_questions_read: int = 0
    gsm8k_questions: int = 0  # after the cap
    gsm8k_corrupted: dict[str, int] = field(default_factory=dict)  # per kind
    gsm8k_corruptions_missing: int = 0  # requested copies that no kind could make
    single_step_dropped: int = 0
    eval_questions: dict[str, int] = field(default_factory=dict)  # distinct questions per evaluation set
    eval_dedup_removed: int = 0
    eval_dedup_by_set: dict[str, int] = field(default_factory=dict)  # a row matching two sets counts in both
    train_rows: int = 0
    valid_rows: int = 0
    train_questions: int = 0
    valid_questions: int = 0
    rows_by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    steps_positive: dict[str, int] = field(default_factory=dict)
    steps_negative: dict[str, int] = field(default_factory=dict)


def normalise(text: str) -> str:
    """Case and whitespace folded, nothing else: the exact-match key for de-duplication.

    Re-typeset or reworded copies (PRMBench rewrites "$x$" as "x" across class files)
    stay distinct; catching those needs a fuzzy match this module does not attempt.
    """
    return " ".join(text.casefold().split())


# ---- numbers ---------------------------------------------------------------------------


def _value(token: str) -> Decimal:
    return Decimal(token.replace(",", ""))


def _places(token: str) -> int:
    return len(token.partition(".")[2])


def _format(value: Decimal, like: str) -> str:
    """`value` written as `like` is: its decimal places (or more if needed), commas, a bare ".5"."""
    places = max(_places(like), -min(0, value.normalize().as_tuple().exponent))
    text = f"{value:{',' if ',' in like else ''}.{places}f}"
    return text[1:] if like.startswith(".") and text.startswith("0.") else text


def _values(text: str) -> list[Decimal]:
    return [_value(m.group()) for m in _NUMBER.finditer(text)]


def _wrong(value: Decimal, places: int, rng: random.Random, taken: set[Decimal]) -> Decimal:
    """A value off by up to about half of `value`, same precision, positive if `value` is, and
    equal to no number already in the problem, so it cannot be read as another quantity."""
    unit = Decimal(1).scaleb(-places)
    span = max(2, int(abs(value) / unit) // 2)
    for attempt in range(100):
        offset = rng.randint(1, span << (attempt // 10)) * unit
        new = value - offset if rng.random() < 0.5 and value - offset > 0 else value + offset
        if new not in taken:
            return new
    raise AssertionError("unreachable: the widening range always leaves a free value")


def _evaluate(segment: str, mapping: dict[Decimal, Decimal]) -> Fraction | None:
    """Exact value of the longest arithmetic that ends `segment`, its numbers first rewritten by
    `mapping`; words and units are dropped ("4 houses * 3 gnomes" is 4 * 3). None if none parses."""
    text = _NUMBER.sub(lambda m: f" {mapping.get(_value(m.group()), _value(m.group())):f} ", segment)
    text = _WORD.sub(" ", _UNIT.sub(" ", _TIMES.sub("*", text))).translate(_SYMBOLS)
    for start in _START.finditer(text):
        try:
            value = _fold(ast.parse(text[start.start() :].strip(), mode="eval").body)
        except (SyntaxError, ZeroDivisionError):
            continue
        if value is not None:
            return value
    return None


def _fold(node: ast.expr) -> Fraction | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _fold(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _fold(node.left), _fold(node.right)
        return None if left is None or right is None else _OPERATORS[type(node.op)](left, right)
    return None


def _results(step: str) -> list[re.Match[str]]:
    """The numbers a step computes: the one right after each "=", else its last number."""
    tokens = list(_NUMBER.finditer(step))
    return [m for m in tokens if _AFTER_EQUALS.search(step, 0, m.start())] or tokens[-1:]


def _arithmetic(step: str, result: re.Match[str]) -> tuple[int, int] | None:
    """Where the text between the previous "=" and the one before `result` lies, if its
    arithmetic gives `result`, exactly or rounded to its decimals (the check that keeps
    prose from being misread as arithmetic)."""
    end = step.rfind("=", 0, result.start())
    start = step.rfind("=", 0, end) + 1
    exact, value, places = _evaluate(step[start:end], {}), _value(result.group()), _places(result.group())
    if exact is None or not (exact == Fraction(value) or places and _rounded(exact, places) == value):
        return None
    return start, end


# ---- GSM8K references and their corruptions ----------------------------------------------


def _candidates(traj: Trajectory, fresh_only: bool) -> list[tuple[int, re.Match[str]]]:
    """(step, result) pairs before the last step whose value a later step uses again.

    `fresh_only` also asks that the value appear nowhere before (question, earlier steps,
    elsewhere in its step), so every later occurrence can be taken as this result.
    """
    values = [_values(s) for s in traj.steps]
    seen = set(_values(traj.question))
    out = []
    for t, step in enumerate(traj.steps[:-1]):
        for m in _results(step):
            v = _value(m.group())
            fresh = v not in seen and values[t].count(v) == 1
            if any(v in later for later in values[t + 1 :]) and (fresh or not fresh_only):
                out.append((t, m))
        seen.update(values[t])
    return out


def _corrupted(traj: Trajectory, steps: list[str], t: int, kind: str, old: str, new: str) -> Trajectory:
    meta = {**traj.meta, "kind": kind, "first_error": t, "corruption": {"step": t, "from": old, "to": new}}
    return replace(traj, steps=steps, labels=labels_from_first_error(t, len(steps)), meta=meta)


def _carry(step: str, mapping: dict[Decimal, Decimal]) -> str:
    """One later step redone under `mapping` (right value -> wrong value).

    A result whose arithmetic checks out on the original numbers is recomputed from the
    rewritten operands and joins the mapping, so the error flows on as consistent
    arithmetic; one that comes out unchanged is a coincidence and is kept. Other numbers
    equal to a mapped value are replaced, also one restating a result of this same step
    before computing it ("80 are regular because 100 - 20 = 80"), unless that value is
    also an operand here, where it more likely names something else.
    """
    tokens = list(_NUMBER.finditer(step))
    values = [_value(m.group()) for m in tokens]
    before, operands, decided = dict(mapping), set(), {}
    for k, m in enumerate(tokens):
        span = _arithmetic(step, m) if _AFTER_EQUALS.search(step, 0, m.start()) else None
        if span is None:
            continue
        inside = [j for j, o in enumerate(tokens) if span[0] <= o.start() < span[1]]
        decided |= {j: mapping.get(values[j], values[j]) for j in inside}
        operands.update(values[j] for j in inside)
        exact = _evaluate(step[span[0] : span[1]], mapping)
        decided[k] = values[k] if exact is None or exact == Fraction(values[k]) else _decimal(exact, _places(m.group()))
        if decided[k] != values[k]:
            mapping[values[k]] = decided[k]
    out, pos = [], 0
    for k, (m, v) in enumerate(zip(tokens, values)):
        new = decided.get(k, before.get(v, v if v in operands else mapping.get(v, v)))
        if new != v:
            out.append(step[pos : m.start()] + _format(new, m.group()))
            pos = m.end()
    return "".join(out) + step[pos:]


def _rounded(x: Fraction, places: int) -> Decimal:
    return (Decimal(x.numerator) / Decimal(x.denominator)).quantize(Decimal(1).scaleb(-places))


def _decimal(x: Fraction, places: int) -> Decimal:
    """A recomputed result as a solution would write it: whole, or rounded to 2 decimals (more if `places` has)."""
    return Decimal(x.numerator) if x.denominator == 1 else _rounded(x, max(places, 2)).normalize()


def corrupt_carried(traj: Trajectory, rng: random.Random) -> Trajectory | None:
    """One computed result made wrong, and every later step redone with it (see `_carry`), so
    the slip flows into the final answer; labels 0 from the slip on. None if no result fits.

    A wrong value that drives a later result below zero (a negative change, -2 miles) is
    redrawn, up to 10 times, since such text gives itself away.
    """
    candidates = _candidates(traj, fresh_only=True)
    if not candidates:
        return None
    t, m = rng.choice(candidates)
    taken = set(_values(traj.question)).union(*map(_values, traj.steps))
    right, step = _value(m.group()), traj.steps[t]
    for _ in range(10):
        mapping = {right: _wrong(right, _places(m.group()), rng, taken)}
        new = _format(mapping[right], m.group())
        steps = [*traj.steps[:t], step[: m.start()] + new + step[m.end() :]]
        steps += [_carry(s, mapping) for s in traj.steps[t + 1 :]]
        if min(mapping.values()) >= 0:
            return _corrupted(traj, steps, t, "carried", m.group(), new)
    return None


def corrupt_claim(traj: Trajectory, rng: random.Random) -> Trajectory | None:
    """One computed result made wrong in its own step only, so a later step that still uses the
    right value contradicts it; labels 0 from that step on. None if no result is used again."""
    candidates = _candidates(traj, fresh_only=False)
    if not candidates:
        return None
    t, m = rng.choice(candidates)
    taken = set(_values(traj.question)).union(*map(_values, traj.steps))
    new = _format(_wrong(_value(m.group()), _places(m.group()), rng, taken), m.group())
    steps = list(traj.steps)
    steps[t] = steps[t][: m.start()] + new + steps[t][m.end() :]
    return _corrupted(traj, steps, t, "claim", m.group(), new)


CORRUPTIONS: dict[str, Callable[[Trajectory, random.Random], Trajectory | None]] = {
    "carried": corrupt_carried,
    "claim": corrupt_claim,
}


def _gsm8k_train(data_root: str, recipe: DataRecipe, report: DataReport) -> list[Trajectory]:
    """References and their corrupted copies, in file order. Copy k of question i uses a
    generator seeded by (seed, i, k) and the kind order drawn from (seed, i), so a row does
    not change when the cap does; a kind that does not apply falls back to the other."""
    rows, name = read_rows(str(data_file(data_root, "gsm8k", "train.jsonl.gz")))
    report.gsm8k_questions_read = len(rows)
    kinds = list(CORRUPTIONS)
    made: Counter[str] = Counter()
    chosen = spread(len(rows), recipe.gsm8k_questions).tolist()
    report.gsm8k_questions = len(chosen)
    out = []
    for i in chosen:
        row = rows[i]
        reference = gsm8k_reference(row.get("question"), row.get("answer"), f"{name} row {i + 1}")
        reference.meta |= {"index": i, "group": normalise(reference.question)}
        out.append(reference)
        seen, first = {tuple(reference.steps)}, mix_seed(recipe.seed, i) % 2
        for k in range(recipe.corruptions_per_question):
            rng = random.Random(mix_seed(mix_seed(recipe.seed, i), k))
            order = (kinds[(first + k) % 2], kinds[(first + k + 1) % 2])
            copy = next((c for kind in order if (c := CORRUPTIONS[kind](reference, rng)) is not None), None)
            if copy is None or tuple(copy.steps) in seen:
                report.gsm8k_corruptions_missing += 1
                continue
            seen.add(tuple(copy.steps))
            made[copy.meta["kind"]] += 1
            out.append(copy)
    report.gsm8k_corrupted = dict(sorted(made.items()))
    return out


# ---- PRMBench and the evaluation sets ----------------------------------------------------


def prmbench_train(data_root: str) -> tuple[list[Trajectory], int]:
    """Every PRMBench-train trajectory once, with how many repeats were dropped.

    Each clean original recurs in all 8 class files (often lightly re-typeset, so some
    copies survive the exact key). A modified process identical to a clean one (an edit
    that changed nothing) is dropped whatever the file order, since its error labels
    would be wrong. Rows the reader rejects are skipped with a warning. All rows of one
    PRM800K problem share meta["group"], its PRMBench idx.
    """
    files = sorted(data_file(data_root, "prmbench", "classified").glob("prm800k_train_*.jsonl.gz"))
    if not files:
        raise FileNotFoundError(f"{data_root}/prmbench/classified: no prm800k_train_*.jsonl.gz files")
    trajs = [t for path in files for t in load_trajectories(str(path), fmt="prmbench", skip_invalid=True)]
    keys = [(normalise(t.question), tuple(t.steps)) for t in trajs]
    clean = {k for k, t in zip(keys, trajs) if t.meta["variant"] == "original"}
    out, seen = [], set()
    for k, traj in zip(keys, trajs):
        if k in seen or (traj.meta["variant"] == "modified" and k in clean):
            continue
        seen.add(k)
        traj.meta |= {"source": "prmbench", "kind": traj.meta["variant"], "group": f"prmbench:{traj.meta['idx']}"}
        out.append(traj)
    return out, len(trajs) - len(out)


def evaluation_questions(data_root: str) -> dict[str, set[str]]:
    """Normalised questions of every evaluation set on hand; a set with no file present is left out."""
    root = data_file(data_root)
    prmbench = root / "prmbench" / "classified"
    sources = {f"processbench_{s}": ([root / "processbench" / f"{s}.json"], ("problem",)) for s in PROCESSBENCH_SUBSETS}
    sources |= {
        "prmbench_test": (
            [*sorted(prmbench.glob("prm800k_test_*.jsonl.gz")), prmbench / "prm_test_p12_multi_solutions.jsonl.gz"],
            ("original_question", "modified_question", "question"),
        ),
        "math500": ([root / QUESTION_SETS["math500"]], ("problem",)),
        "gsm8k_test": ([root / QUESTION_SETS["gsm8k"]], ("question",)),
        "gsm_plus": ([root / QUESTION_SETS["gsm_plus"]], ("question", "seed_question")),
        # The pool's own copy of the GSM8K test questions, read so a changed pool is still caught.
        "gsm8k_bon_small": ([root / "gsm8k_bon_small" / "openai_example_model_solutions.jsonl.gz"], ("question",)),
    }
    out = {}
    for name, (paths, keys) in sources.items():
        rows = [row for path in paths if path.is_file() for row in read_rows(str(path))[0]]
        if rows:
            out[name] = {normalise(row[k]) for row in rows for k in keys if isinstance(row.get(k), str)}
    return out


# ---- the mix -----------------------------------------------------------------------------


def _in_valid(group: str, recipe: DataRecipe) -> bool:
    digest = hashlib.sha256(f"{recipe.seed}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < recipe.valid_fraction


def _drop_evaluation(trajs: list[Trajectory], evals: dict[str, set[str]], report: DataReport) -> list[Trajectory]:
    """Remove every row of a problem any of whose question texts is in an evaluation set: one
    exact hit flags the re-typeset variants of the same problem that the exact key misses."""
    hits: dict[str, set[str]] = {}
    for traj in trajs:
        question = normalise(traj.question)
        hits.setdefault(traj.meta["group"], set()).update(name for name, qs in evals.items() if question in qs)
    removed = [t for t in trajs if hits[t.meta["group"]]]
    report.eval_dedup_removed = len(removed)
    report.eval_dedup_by_set = {name: sum(name in hits[t.meta["group"]] for t in removed) for name in evals}
    return [t for t in trajs if not hits[t.meta["group"]]]


def build(data_root: str, recipe: DataRecipe) -> tuple[list[Trajectory], list[Trajectory], DataReport]:
    """(train, valid, report): PRMBench rows then GSM8K rows, in file order, split by problem."""
    report = DataReport(recipe=asdict(recipe))
    prmbench, report.prmbench_duplicates = prmbench_train(data_root)
    report.prmbench_rows_read = len(prmbench) + report.prmbench_duplicates
    prmbench = [prmbench[i] for i in spread(len(prmbench), recipe.prmbench_rows).tolist()]
    report.prmbench_rows = len(prmbench)
    rows = prmbench + _gsm8k_train(data_root, recipe, report)

    long_enough = [t for t in rows if len(t.steps) >= recipe.min_steps]
    report.single_step_dropped = len(rows) - len(long_enough)
    evals = evaluation_questions(data_root)
    report.eval_questions = {name: len(qs) for name, qs in evals.items()}
    kept = _drop_evaluation(long_enough, evals, report)

    train = [t for t in kept if not _in_valid(t.meta["group"], recipe)]
    valid = [t for t in kept if _in_valid(t.meta["group"], recipe)]
    report.train_rows, report.valid_rows = len(train), len(valid)
    report.train_questions, report.valid_questions = (len({t.meta["group"] for t in ts}) for ts in (train, valid))
    for split, trajs in (("train", train), ("valid", valid)):
        report.rows_by_kind[split] = dict(
            sorted(Counter(f"{t.meta['source']}_{t.meta['kind']}" for t in trajs).items())
        )
        labels = [y for t in trajs for y in t.labels]
        report.steps_positive[split] = sum(y >= 0.5 for y in labels)
        report.steps_negative[split] = len(labels) - report.steps_positive[split]
    return train, valid, report


def write(out_dir: str, train: list[Trajectory], valid: list[Trajectory], report: DataReport) -> None:
    """train.jsonl and valid.jsonl in TRL stepwise format, and report.json."""
    out = Path(out_dir)
    write_trajectories(out / "train.jsonl", train)
    write_trajectories(out / "valid.jsonl", valid)
    (out / "report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
