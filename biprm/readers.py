"""Raw rows (local files or the Hugging Face Hub) -> `Trajectory`.

Each converter names the file, the row and the raw field in its errors and ends with
`validate`, so a malformed row stops here instead of surfacing later as a shape error.
"""
from __future__ import annotations

import gzip
import json
import logging
import re
from collections import Counter
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable

from biprm.trajectory import DataError, Trajectory, labels_from_first_error, validate

log = logging.getLogger(__name__)

MS_TAG = "ки"  # Math-Shepherd's step tag (Cyrillic, U+043A U+0438)
EMPTY_RESPONSE = "(empty response)"  # stands in for a candidate that produced no text, so pools keep their size
_DATA_SUFFIX = re.compile(r"\.(jsonl?|parquet|csv|txt)(\.gz)?$|\.gz$")
_SEPARATORS = {"newline": re.compile(r"\n"), "double-newline": re.compile(r"\n\s*\n"), MS_TAG: re.compile(MS_TAG)}
SPLIT_RULES = ("auto", *_SEPARATORS)
_ANNOTATION = re.compile(r"<<[^<>]*>>")  # GSM8K calculator annotations: <<3*4=12>>
# A closing "#### N" (GSM8K style) or "A: N" line, with MetaMath's repeated "The answer is: N" after it.
_FINAL_MARK = re.compile(r"(?:####|(?m:^)A:)\s*([^\n]*\S)\s*(?:\nThe answer is:?[^\n]*)?\s*\Z")


# ---- reading rows ---------------------------------------------------------------------


def looks_like_path(source: str) -> bool:
    """Hub names are 'owner/name' with no data-file suffix; anything else that is missing is a bad path."""
    return bool(_DATA_SUFFIX.search(source)) or source.startswith(("/", ".", "~")) or source.count("/") > 1


def _read_jsonl(lines: Any, name: str) -> list[dict]:
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{name} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
    return rows


def _read_file(path: Path) -> list[dict]:
    gz = path.suffix == ".gz"
    kind = Path(path.stem).suffix if gz else path.suffix
    if kind == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(gzip.open(path) if gz else path).to_pylist()
    if kind not in (".json", ".jsonl"):
        raise DataError(f"{path}: unknown file type; use .json, .jsonl or .parquet, optionally gzipped")
    with gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8") as f:
        if kind == ".jsonl":
            return _read_jsonl(f, str(path))
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list)]
        raise DataError(f"{path}: expected a JSON list of rows, found an object (list-valued keys: {lists}); save the list itself")
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of rows, found {type(data).__name__}")
    return data


def read_rows(source: str, split: str = "train") -> tuple[list[dict], str]:
    """Rows of a local .json/.jsonl/.parquet file (optionally .gz), else of a Hub dataset 'name[:config]'.

    Returns the rows and the display name that error messages use.
    """
    path = Path(source).expanduser()
    if path.is_file():
        return _read_file(path), str(path)
    if path.exists():
        raise FileNotFoundError(f"{source}: is not a data file")
    if looks_like_path(source):
        raise FileNotFoundError(f"{source}: no such data file (and it does not look like a Hugging Face dataset name)")
    import datasets

    name, _, config = source.partition(":")
    return datasets.load_dataset(name, config or None, split=split).to_list(), f"{source}[{split}]"


# ---- steps -----------------------------------------------------------------------------


def split_steps(text: str, rule: str = "auto") -> list[str]:
    """Cut a free-text solution into stripped, non-empty steps.

    Rules: "newline" (lines), "double-newline" (paragraphs), "ки" (Math-Shepherd tags), and
    "auto": tags if present, else paragraphs if there are at least two, else lines.
    """
    if rule == "auto":
        paragraphs = split_steps(text, "double-newline")
        return split_steps(text, MS_TAG) if MS_TAG in text else paragraphs if len(paragraphs) >= 2 else split_steps(text, "newline")
    if rule not in _SEPARATORS:
        raise ValueError(f"unknown split rule {rule!r}; choose from {list(SPLIT_RULES)}")
    return [s.strip() for s in _SEPARATORS[rule].split(text) if s.strip()]


def solution_steps(text: str, rule: str = "auto") -> list[str]:
    """Steps of a GSM8K-style solution: calculator annotations removed, and a closing "#### N" / "A: N"
    turned into a final step "The answer is N." so every policy ends the same way."""
    text = _ANNOTATION.sub("", text)
    mark = _FINAL_MARK.search(text)
    if mark is None:
        return split_steps(text, rule) or [EMPTY_RESPONSE]
    return split_steps(text[: mark.start()], rule) + [f"The answer is {mark.group(1)}."]


# ---- converters ------------------------------------------------------------------------


def _field(row: dict, key: str, where: str, kind: type) -> Any:
    """row[key], checked to be a `kind` (a bool is not an int here)."""
    if row.get(key) is None:
        raise DataError(f"{where}: field '{key}' is missing")
    value = row[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise DataError(f"{where}: field '{key}' is {type(value).__name__}, expected {kind.__name__}")
    return value


def from_trl(row: dict, where: str) -> Trajectory:
    """TRL stepwise supervision: {"prompt", "completions", "labels"?}; no labels means unlabelled scoring.
    Any other field (an id, an answer, ...) rides along in `meta`, so scores can be joined back."""
    labels = _field(row, "labels", where, list) if row.get("labels") is not None else None
    extra = {k: v for k, v in row.items() if k not in ("prompt", "completions", "labels")}
    traj = Trajectory(_field(row, "prompt", where, str), _field(row, "completions", where, list), labels, meta=extra)
    return validate(traj, where)


def from_steps(row: dict, where: str) -> Trajectory:
    """The layout of `Trajectory`, the server and the Python examples: {"question", "steps", "labels"?, "answer"?};
    any other field (an id, ...) rides along in `meta`."""
    labels = _field(row, "labels", where, list) if row.get("labels") is not None else None
    answer = None if row.get("answer") is None else str(row["answer"])
    extra = {k: v for k, v in row.items() if k not in ("question", "steps", "labels", "answer")}
    traj = Trajectory(_field(row, "question", where, str), _field(row, "steps", where, list), labels, answer=answer, meta=extra)
    return validate(traj, where)


def from_math_shepherd(row: dict, where: str) -> Trajectory:
    """Raw Math-Shepherd: `label` is `input` with each step tag replaced by "+" or "-".

    The marks are read at the tag positions, so the two texts must have matching lengths.
    Steps keep their "Step k:" prefixes, as written in the data.
    """
    text, marked = _field(row, "input", where, str), _field(row, "label", where, str)
    pieces = text.split(MS_TAG)
    n = len(pieces) - 1
    if n == 0:
        raise DataError(f"{where}: field 'input' has no step tag {MS_TAG!r}")
    if len(marked) != len(text) - n * (len(MS_TAG) - 1):
        raise DataError(
            f"{where}: field 'label' has {len(marked)} characters, but 'input' with each of its {n} step tags "
            f"replaced by one '+' or '-' has {len(text) - n * (len(MS_TAG) - 1)}"
        )
    marks = [marked[p - 1] for p in accumulate(len(piece) + 1 for piece in pieces[:-1])]
    bad = next((k for k, m in enumerate(marks) if m not in "+-"), None)
    if bad is not None:
        raise DataError(f"{where}: field 'label' has {marks[bad]!r} at the tag of step {bad + 1}, expected '+' or '-'")
    if pieces[-1].strip():
        raise DataError(f"{where}: field 'input' has unlabelled text after the last step tag")
    question, step1, first = pieces[0].rpartition("Step 1:")
    if not step1:
        raise DataError(f"{where}: field 'input' has no 'Step 1:' before the first step tag")
    steps = [(step1 + first).strip(), *(p.strip() for p in pieces[1:-1])]
    labels = [1.0 if m == "+" else 0.0 for m in marks]
    return validate(Trajectory(question.strip(), steps, labels, meta={"task": row.get("task")}), where)


def from_processbench(row: dict, where: str) -> Trajectory:
    """ProcessBench: `label` is the 0-based first wrong step, or -1 when every step is right."""
    meta = {k: row.get(k) for k in ("id", "generator", "final_answer_correct")}
    traj = validate(Trajectory(_field(row, "problem", where, str), _field(row, "steps", where, list), meta=meta), where)
    first = _field(row, "label", where, int)
    if not -1 <= first < len(traj.steps):
        raise DataError(f"{where}: field 'label' is {first}, expected -1 or a step index in [0, {len(traj.steps) - 1}]")
    traj.labels, traj.meta["first_error"] = labels_from_first_error(first, len(traj.steps)), first
    return traj


def from_prmbench(row: dict, where: str) -> list[Trajectory]:
    """PRMBench: the clean original process (all steps right) and the modified one.

    `error_steps` is 1-based and not always sorted; the modified process is labelled with
    the first-error convention (1 before min(error_steps), 0 from it on), as ProcessBench
    does. Listed steps past the end of the process are kept in meta but otherwise ignored;
    an empty list (the multi_solutions class) means an alternative, fully correct solution.
    """
    errors = _field(row, "error_steps", where, list)
    if any(not isinstance(e, int) or isinstance(e, bool) or e < 1 for e in errors):
        raise DataError(f"{where}: field 'error_steps' must hold 1-based step numbers, got {errors}")
    meta = {"idx": row.get("idx"), "classification": row.get("classification")}
    answer = None if row.get("ground_truth") is None else str(row["ground_truth"])
    trajs = []
    for variant in ("original", "modified"):
        traj = Trajectory(
            _field(row, f"{variant}_question", where, str),
            _field(row, f"{variant}_process", where, list),
            answer=answer,
            meta={**meta, "variant": variant},
        )
        trajs.append(validate(traj, f"{where} ({variant}_process)"))
    original, modified = trajs
    first = min(errors, default=0) - 1
    if first >= len(modified.steps):
        raise DataError(f"{where}: field 'error_steps' {errors} points past the {len(modified.steps)} steps of 'modified_process'")
    original.labels = [1.0] * len(original.steps)
    modified.labels = labels_from_first_error(first, len(modified.steps))
    modified.meta["error_steps"] = errors
    return trajs


def from_bon_pool(row: dict, where: str, split_rule: str = "auto", qid: int = 0) -> list[Trajectory]:
    """Best-of-N candidates of one question: PQM's {"question", "responses": [{"text"}]} or
    ours {"question", "answer"?, "candidates": [{"steps"} | {"text"}, "correct"?]}. A candidate
    may also be a plain string (what generators usually write): its text, cut by `split_rule`."""
    question = _field(row, "question", where, str)
    key = "candidates" if "candidates" in row else "responses"
    if key not in row:
        raise DataError(f"{where}: field 'candidates' (or PQM's 'responses') is missing")
    cands = _field(row, key, where, list)
    if not cands:
        raise DataError(f"{where}: field '{key}' is an empty list")
    answer = None if row.get("answer") is None else str(row["answer"])
    trajs = []
    for j, cand in enumerate(cands):
        at = f"{where} {key}[{j}]"
        if isinstance(cand, str):
            cand = {"text": cand}
        if not isinstance(cand, dict):
            raise DataError(f"{at}: expected a string or an object with 'steps' or 'text', got a {type(cand).__name__}")
        steps = _field(cand, "steps", at, list) if "steps" in cand else split_steps(_field(cand, "text", at, str), split_rule)
        correct = _field(cand, "correct", at, bool) if cand.get("correct") is not None else None
        meta = {"qid": qid, "cand": j} | ({"policy": cand["model_name"]} if "model_name" in cand else {})
        trajs.append(validate(Trajectory(question, steps, answer=answer, correct=correct, meta=meta), at))
    return trajs


# ---- loading ---------------------------------------------------------------------------

_SIGNATURES = (
    ("prmbench", {"original_process", "modified_process", "error_steps"}),
    ("processbench", {"problem", "steps", "label"}),
    ("math-shepherd", {"input", "label"}),
    ("trl", {"prompt", "completions"}),
    ("bon", {"question", "candidates"}),
    ("bon", {"question", "responses"}),
    ("steps", {"question", "steps"}),
)
FORMATS = ("trl", "steps", "math-shepherd", "processbench", "prmbench", "bon")


def detect_format(row: dict, where: str) -> str:
    """The format whose required fields the row has; the most specific signature wins."""
    fmt = next((fmt for fmt, keys in _SIGNATURES if isinstance(row, dict) and keys <= row.keys()), None)
    if fmt is None:
        fields = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise DataError(f"{where}: cannot tell the format from fields {fields}; name it with --format, one of {FORMATS}")
    return fmt


def row_converter(fmt: str, split_rule: str) -> Callable[[dict, str, int], Trajectory | list[Trajectory]]:
    if fmt == "bon":
        return lambda row, where, i: from_bon_pool(row, where, split_rule, qid=i)
    simple = {"trl": from_trl, "steps": from_steps, "math-shepherd": from_math_shepherd, "processbench": from_processbench, "prmbench": from_prmbench}
    if fmt not in simple:
        raise ValueError(f"unknown format {fmt!r}; choose from {('auto', *FORMATS)}")
    return lambda row, where, i: simple[fmt](row, where)


def skip_reason(error: str, where: str) -> str:
    """An error message without its row and numbers, so that skipped rows can be counted by kind."""
    reason = re.sub(r"\[[\d, ]*\]", "[...]", error.removeprefix(where).lstrip(" :"))
    return re.sub(r"\d+", "N", reason)


PLURALS = {"row": "rows", "trajectory": "trajectories"}


def skip_report(name: str, errors: list[tuple[int, str]], total: int, unit: str = "row") -> str:
    """The one wording of skipped input: skipped rows counted by kind of error, each kind shown by its first
    row's own message (which starts with "NAME UNIT N"):
    "NAME: skipped 3 of 9 rows: 2 rows like row 5 (field 'labels' has 1 labels for 2 steps); row 9 (field 'prompt' is missing)"."""
    kinds: dict[str, list[tuple[int, str]]] = {}
    for row, error in errors:
        kinds.setdefault(skip_reason(error, f"{name} {unit} {row}"), []).append((row, error))
    parts = []
    for group in sorted(kinds.values(), key=len, reverse=True):
        row, error = group[0]
        shown = f"{unit} {row} ({error.removeprefix(f'{name} {unit} {row}').lstrip(' :')})"
        parts.append(shown if len(group) == 1 else f"{len(group)} {PLURALS[unit]} like {shown}")
    return f"{name}: skipped {len(errors)} of {total} {PLURALS[unit]}: {'; '.join(parts)}"


def load_with_report(
    source: str, fmt: str = "auto", split: str = "train", skip_invalid: bool = False, split_rule: str = "auto"
) -> tuple[list[Trajectory], dict[str, int]]:
    """Trajectories of every row, and how many rows were skipped for each reason (empty unless skip_invalid).

    Rows are numbered from 1 in file order in messages; a BoN row's index from 0 is its qid.
    """
    rows, name = read_rows(source, split)
    if not rows:
        raise DataError(f"{name}: has no rows")
    convert = row_converter(detect_format(rows[0], f"{name} row 1") if fmt == "auto" else fmt, split_rule)
    trajs: list[Trajectory] = []
    errors: list[tuple[int, str]] = []
    for i, row in enumerate(rows):
        where = f"{name} row {i + 1}"
        try:
            if not isinstance(row, dict):
                raise DataError(f"{where}: is a {type(row).__name__}, expected an object")
            got = convert(row, where, i)
        except DataError as e:
            if not skip_invalid:
                raise
            errors.append((i + 1, str(e)))
            continue
        trajs.extend(got if isinstance(got, list) else [got])
    if errors:
        log.warning(skip_report(name, errors, len(rows)))
    return trajs, dict(Counter(skip_reason(e, f"{name} row {row}") for row, e in errors))


def load_trajectories(
    source: str, fmt: str = "auto", split: str = "train", skip_invalid: bool = False, split_rule: str = "auto"
) -> list[Trajectory]:
    """`load_with_report` without the report (skips are still logged as a warning)."""
    return load_with_report(source, fmt, split, skip_invalid, split_rule)[0]


# ---- the local GSM8K Best-of-N pool ----------------------------------------------------

OPENAI_POLICIES = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
GSMPLUS_POLICIES = ("abel_7b", "abel_13b", "abel_70b", "gpt-3.5-turbo", "gpt4", "metamath_7b", "metamath_13b", "metamath_70b")


def _column(
    rows: list[dict], name: str, questions: list[str], question_key: str, text_key: str, flag_key: str, nested: str | None = None
) -> list[tuple[str, bool]]:
    """(solution, is_correct) per question, after checking the file is aligned with gsm8k/test.jsonl."""
    if len(rows) != len(questions):
        raise DataError(f"{name}: has {len(rows)} rows, expected {len(questions)} (one per GSM8K test question)")
    column = []
    for i, (row, question) in enumerate(zip(rows, questions)):
        where = f"{name} row {i + 1}"
        if question not in _field(row, question_key, where, str):
            raise DataError(f"{where}: field '{question_key}' does not match question {i + 1} of gsm8k/test.jsonl")
        sample, at = (_field(row, nested, where, dict), f"{where} {nested}") if nested else (row, where)
        column.append((_field(sample, text_key, at, str), _field(sample, flag_key, at, bool)))
    return column


def gsm8k_bon_small(data_dir: str) -> list[Trajectory]:
    """The 12-candidate pool for the 1,319 GSM8K test questions; `data_dir` holds gsm8k/ and gsm8k_bon_small/.

    Candidates per question, in this order (cand 0..11): the OpenAI example solutions
    (OPENAI_POLICIES), then the GSM-Plus predictions (GSMPLUS_POLICIES). Trajectories are
    grouped by question. A candidate with no text becomes the single step EMPTY_RESPONSE.
    """
    root = Path(data_dir)
    tests, name = read_rows(str(root / "gsm8k" / "test.jsonl"))
    questions, golds = [], []
    for i, row in enumerate(tests):
        where = f"{name} row {i + 1}"
        solution = _field(row, "answer", where, str)
        if "####" not in solution:
            raise DataError(f"{where}: field 'answer' has no '#### N' final answer")
        questions.append(_field(row, "question", where, str))
        golds.append(solution.rsplit("####", 1)[1].strip().replace(",", ""))

    pool = root / "gsm8k_bon_small"
    rows, name = read_rows(str(pool / "openai_example_model_solutions.jsonl.gz"))
    columns = [(p, _column(rows, name, questions, "question", "solution", "is_correct", nested=p)) for p in OPENAI_POLICIES]
    for policy in GSMPLUS_POLICIES:
        rows, name = read_rows(str(pool / f"gsmplus_repo_gsm8k_pred_{policy}.json.gz"))
        keys = ("input", "completion") if policy.startswith("metamath") else ("question", "model_prediction")
        columns.append((policy, _column(rows, name, questions, *keys, "result")))

    trajs = []
    for qid, (question, gold) in enumerate(zip(questions, golds)):
        for cand, (policy, column) in enumerate(columns):
            text, correct = column[qid]
            traj = Trajectory(question, solution_steps(text), answer=gold, correct=correct, meta={"qid": qid, "cand": cand, "policy": policy})
            trajs.append(validate(traj, f"{pool} question {qid + 1} candidate {policy}"))
    empty = sum(t.steps == [EMPTY_RESPONSE] for t in trajs)
    if empty:
        log.warning("%s: %d candidates have no text; each is kept as the single step %r", pool, empty, EMPTY_RESPONSE)
    return trajs
