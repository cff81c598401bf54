"""Raw rows (local files, the Hugging Face Hub or the embedded synthetic task) -> `Trajectory`.

Each converter names the file, the row and the raw field in its errors and ends with
`validate`, so a malformed row stops here instead of surfacing later as a shape error.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from biprm.config import FORMATS, SEGMENTERS
from biprm.data.segment import MS_TAG, RULES, Segmenter, step_at
from biprm.data.synthetic import make_dataset
from biprm.data.trajectory import DataError, Trajectory, labels_from_first_error, validate

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

EMPTY_RESPONSE = "(empty response)"  # stands in for a candidate that produced no text, so pools keep their size
_DATA_SUFFIX = re.compile(r"\.(jsonl?|parquet|csv|txt)(\.gz)?$|\.gz$")
SPLIT_RULES = (*RULES, *SEGMENTERS[1:-1])  # what a text can be cut by without a tokenizer (biprm.data.segment)
_ANNOTATION = re.compile(r"<<[^<>]*>>")  # GSM8K calculator annotations: <<3*4=12>>
# A closing "#### N" (GSM8K style) or "A: N" line, with MetaMath's repeated "The answer is: N" after it.
_FINAL_MARK = re.compile(r"(?:####|(?m:^)A:)\s*([^\n]*\S)\s*(?:\nThe answer is:?[^\n]*)?\s*\Z")


# ---- reading rows ---------------------------------------------------------------------


def looks_like_path(source: str) -> bool:
    """Hub names are 'owner/name' with no data-file suffix; anything else that is missing is a bad path."""
    return bool(_DATA_SUFFIX.search(source)) or source.startswith(("/", ".", "~")) or source.count("/") > 1


def _read_jsonl(lines: Any, name: str) -> list[dict]:
    return list(_parsed(lines, name))


def _parsed(lines: Any, name: str) -> Iterator[Any]:
    """Each non-blank line's JSON value; a broken line is named by its line and column in the file."""
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{name} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None


def check_rows(spec: str) -> None:
    """`check_source`, and a local file read through once as the readers read it: a broken line (by line and column)
    or an empty file is refused before a model loads, not after minutes of loading it. A JSONL file is parsed line by
    line without keeping its rows."""
    check_source(spec)
    path = Path(spec).expanduser()
    if synthetic_spec(spec) is not None or not path.is_file():
        return
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
            rows = sum(1 for _ in _parsed(f, str(path)))
    else:
        rows = len(_read_file(path))
    if not rows:
        raise DataError(f"{path}: no rows (the file is empty)")


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
        raise DataError(
            f"{path}: expected a JSON list of rows, found an object (list-valued keys: {lists}); save the list itself"
        )
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
    table, name = _hub_dataset(source, split)
    return table.to_list(), name


def _hub_dataset(
    source: str, split: str, streaming: bool = False
) -> tuple[datasets.Dataset | datasets.IterableDataset, str]:
    import datasets

    name, _, config = source.partition(":")
    return datasets.load_dataset(name, config or None, split=split, streaming=streaming), f"{source}[{split}]"


def synthetic_spec(spec: str) -> tuple[int, int] | None:
    """(rows, seed) of "synthetic[:N[:SEED]]", the embedded task; None for any other source."""
    if spec != "synthetic" and not spec.startswith("synthetic:"):
        return None
    parts = spec.split(":")
    if len(parts) > 3 or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(
            f"data {spec!r}: the synthetic task is written synthetic[:N[:SEED]] with whole numbers N and SEED"
        )
    return (int(parts[1]) if len(parts) > 1 else 2000, int(parts[2]) if len(parts) > 2 else 0)


def check_source(spec: str) -> None:
    """Name a data path that is not there at once, before a model loads (a Hub name is checked when it is read)."""
    path = Path(spec).expanduser()
    if synthetic_spec(spec) is None and not path.is_file() and (path.exists() or looks_like_path(spec)):
        read_rows(spec)  # raises the reader's one-line error, naming the path


def read_table(
    source: str, split: str = "train", streaming: bool = False
) -> tuple[datasets.Dataset | datasets.IterableDataset, str]:
    """`read_rows` as an Arrow table (a Hub dataset already is one), memory-mapped instead of held as Python rows."""
    import datasets

    check_source(source)
    path = Path(source).expanduser()
    if not path.is_file():
        return _hub_dataset(source, split, streaming)
    kind = "parquet" if ".parquet" in path.suffixes else "json"
    if streaming:
        return datasets.load_dataset(kind, data_files=str(path), split="train", streaming=True), str(path)
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train"), str(path)
    except Exception as error:  # the Arrow reader is strict; the line reader names the bad line and field
        rows, name = read_rows(source, split)
        try:
            return datasets.Dataset.from_list(rows), name
        except Exception:
            raise DataError(f"{path}: rows do not fit one table ({error})") from None


# ---- steps -----------------------------------------------------------------------------


def split_steps(text: str, rule: str | Segmenter = "auto") -> list[str]:
    """Cut a free-text solution into stripped, non-empty steps (biprm.data.segment).

    Rules: "newline" (lines), "double-newline" (paragraphs), "ки" (Math-Shepherd tags),
    "auto": tags if present, else paragraphs if there are at least two, else lines; and the
    segmenters paragraph, lines and markers (or any Segmenter, tokens:N with its tokenizer).
    """
    if isinstance(rule, Segmenter):
        return [s.text for s in rule.text(text)[0]]
    if rule not in SPLIT_RULES:
        raise ValueError(f"unknown split rule {rule!r}; choose from {list(SPLIT_RULES)}")
    return [s.text for s in Segmenter(rule).text(text)[0]]


def solution_steps(text: str, rule: str = "auto") -> list[str]:
    """Steps of a GSM8K-style solution: calculator annotations removed, and a closing "#### N" / "A: N"
    turned into a final step "The answer is N." so every policy ends the same way."""
    text = _ANNOTATION.sub("", text)
    mark = _FINAL_MARK.search(text)
    if mark is None:
        return split_steps(text, rule) or [EMPTY_RESPONSE]
    return split_steps(text[: mark.start()], rule) + [f"The answer is {mark.group(1)}."]


# ---- converters ------------------------------------------------------------------------


def checked_field(row: dict, key: str, where: str, kind: type) -> Any:
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
    labels = checked_field(row, "labels", where, list) if row.get("labels") is not None else None
    extra = {k: v for k, v in row.items() if k not in ("prompt", "completions", "labels")}
    traj = Trajectory(
        checked_field(row, "prompt", where, str), checked_field(row, "completions", where, list), labels, meta=extra
    )
    return validate(traj, where)


def from_steps(row: dict, where: str) -> Trajectory:
    """The layout of `Trajectory`, the server and the Python examples: {"question", "steps", "labels"?, "answer"?};
    any other field (an id, ...) rides along in `meta`."""
    labels = checked_field(row, "labels", where, list) if row.get("labels") is not None else None
    answer = None if row.get("answer") is None else str(row["answer"])
    extra = {k: v for k, v in row.items() if k not in ("question", "steps", "labels", "answer")}
    traj = Trajectory(
        checked_field(row, "question", where, str),
        checked_field(row, "steps", where, list),
        labels,
        answer=answer,
        meta=extra,
    )
    return validate(traj, where)


QUESTION_FIELDS = ("question", "problem", "prompt")
TRACE_FIELDS = ("solution", "response")


def from_trace(row: dict, where: str, segmenter: Segmenter) -> Trajectory:
    """A trace given as one string: {"question" (or "problem", "prompt"), "solution" (or "response")}, cut into steps
    by `segmenter`. Its meta holds each step's [start, end) in that string, the segmenter and any fallback it took, so
    they travel with the scores; any other field rides along too. An optional "first_error_char" (where the first wrong
    text starts in the string, -1 for none) labels the steps of any cut: those before the step that holds it are
    correct (ProcessBench's rule), so one labelled trace trains under every segmenter."""
    for names in (QUESTION_FIELDS, TRACE_FIELDS):
        if not any(k in row for k in names):
            raise DataError(f"{where}: field '{names[0]}' is missing (or {' or '.join(repr(k) for k in names[1:])})")
    qkey = next(k for k in QUESTION_FIELDS if k in row)
    tkey = next(k for k in TRACE_FIELDS if k in row)
    cut = segmenter.cut(checked_field(row, tkey, where, str), f"{where}: field '{tkey}'")
    extra = {k: v for k, v in row.items() if k not in (qkey, tkey, "first_error_char")}
    labels = None
    if "first_error_char" in row:
        at = checked_field(row, "first_error_char", where, int)
        if at < -1:
            raise DataError(f"{where}: field 'first_error_char' is {at}; give a character position, or -1 for none")
        first = -1 if at < 0 else step_at(cut.offsets, at)
        if at >= 0 and first < 0:
            raise DataError(f"{where}: field 'first_error_char' is {at}, past the last step of field '{tkey}'")
        labels = labels_from_first_error(first, len(cut.steps))
    return validate(Trajectory(checked_field(row, qkey, where, str), cut.texts, labels, meta=extra | cut.meta()), where)


def from_math_shepherd(row: dict, where: str) -> Trajectory:
    """Raw Math-Shepherd: `label` is `input` with each step tag replaced by "+" or "-".

    The marks are read at the tag positions, so the two texts must have matching lengths.
    Steps keep their "Step k:" prefixes, as written in the data.
    """
    text, marked = checked_field(row, "input", where, str), checked_field(row, "label", where, str)
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
    traj = validate(
        Trajectory(checked_field(row, "problem", where, str), checked_field(row, "steps", where, list), meta=meta),
        where,
    )
    first = checked_field(row, "label", where, int)
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
    errors = checked_field(row, "error_steps", where, list)
    if any(not isinstance(e, int) or isinstance(e, bool) or e < 1 for e in errors):
        raise DataError(f"{where}: field 'error_steps' must hold 1-based step numbers, got {errors}")
    meta = {"idx": row.get("idx"), "classification": row.get("classification")}
    answer = None if row.get("ground_truth") is None else str(row["ground_truth"])
    trajs = []
    for variant in ("original", "modified"):
        traj = Trajectory(
            checked_field(row, f"{variant}_question", where, str),
            checked_field(row, f"{variant}_process", where, list),
            answer=answer,
            meta={**meta, "variant": variant},
        )
        trajs.append(validate(traj, f"{where} ({variant}_process)"))
    original, modified = trajs
    first = min(errors, default=0) - 1
    if first >= len(modified.steps):
        raise DataError(
            f"{where}: field 'error_steps' {errors} points past the {len(modified.steps)} steps of 'modified_process'"
        )
    original.labels = [1.0] * len(original.steps)
    modified.labels = labels_from_first_error(first, len(modified.steps))
    modified.meta["error_steps"] = errors
    return trajs


def from_bon_pool(row: dict, where: str, split_rule: str | Segmenter = "auto", qid: int = 0) -> list[Trajectory]:
    """Best-of-N candidates of one question: PQM's {"question", "responses": [{"text"}]} or
    ours {"question", "answer"?, "candidates": [{"steps"} | {"text"}, "correct"?]}. A candidate
    may also be a plain string (what generators usually write): its text, cut by `split_rule`. The row's other fields
    (an id, ...) ride along in each candidate's `meta`, beside its `qid` and `cand`."""
    question = checked_field(row, "question", where, str)
    key = "candidates" if "candidates" in row else "responses"
    if key not in row:
        raise DataError(f"{where}: field 'candidates' (or PQM's 'responses') is missing")
    cands = checked_field(row, key, where, list)
    if not cands:
        raise DataError(f"{where}: field '{key}' is an empty list")
    answer = None if row.get("answer") is None else str(row["answer"])
    extra = {k: v for k, v in row.items() if k not in ("question", key, "answer")}
    trajs = []
    for j, cand in enumerate(cands):
        at = f"{where} {key}[{j}]"
        if isinstance(cand, str):
            cand = {"text": cand}
        if not isinstance(cand, dict):
            raise DataError(f"{at}: expected a string or an object with 'steps' or 'text', got a {type(cand).__name__}")
        steps = (
            checked_field(cand, "steps", at, list)
            if "steps" in cand
            else split_steps(checked_field(cand, "text", at, str), split_rule)
        )
        correct = checked_field(cand, "correct", at, bool) if cand.get("correct") is not None else None
        meta = extra | {"qid": qid, "cand": j} | ({"policy": cand["model_name"]} if "model_name" in cand else {})
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
    *(("trace", {q, t}) for q in QUESTION_FIELDS for t in TRACE_FIELDS),
)


def detect_format(row: dict, where: str) -> str:
    """The format whose required fields the row has; the most specific signature wins."""
    fmt = next((fmt for fmt, keys in _SIGNATURES if isinstance(row, dict) and keys <= row.keys()), None)
    if fmt is None:
        fields = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise DataError(
            f"{where}: cannot tell the format from fields {fields}; name it with --format, one of {FORMATS}"
        )
    return fmt


def row_converter(fmt: str, split_rule: str | Segmenter) -> Callable[[dict, str, int], Trajectory | list[Trajectory]]:
    """`split_rule` cuts a Best-of-N candidate's text and a trace row's string (a name, or a Segmenter)."""
    if fmt == "trace":
        segmenter = split_rule if isinstance(split_rule, Segmenter) else Segmenter(split_rule)
        return lambda row, where, i: from_trace(row, where, segmenter)
    if fmt == "bon":
        return lambda row, where, i: from_bon_pool(row, where, split_rule, qid=i)
    simple = {
        "trl": from_trl,
        "steps": from_steps,
        "math-shepherd": from_math_shepherd,
        "processbench": from_processbench,
        "prmbench": from_prmbench,
    }
    if fmt not in simple:
        raise ValueError(f"unknown format {fmt!r}; choose from {('auto', *FORMATS)}")
    return lambda row, where, i: simple[fmt](row, where)


class Rows(NamedTuple):
    """A source's raw rows with what converting them needs: a display name, the format, its columns and a converter."""

    raw: list[dict] | datasets.Dataset | datasets.IterableDataset
    name: str
    fmt: str
    columns: list[str]
    convert: Callable[[dict, str, int], Trajectory | list[Trajectory]]


def open_source(
    source: str,
    fmt: str = "auto",
    split: str = "train",
    split_rule: str | Segmenter = "auto",
    arrow: bool = False,
    streaming: bool = False,
) -> Rows:
    """The one door to data, for Python lists (`load_trajectories`) and Arrow tables (`arrow=True` or `streaming`).

    `synthetic[:N[:SEED]]` is generated here, so it reads (and streams) like a file instead of going to the Hub;
    anything else is a local file or a Hub dataset. The format is told from the first row unless named.
    """
    synthetic = synthetic_spec(source)
    if synthetic is not None:
        trajs = make_dataset(*synthetic)
        if arrow or streaming:
            import datasets

            table = datasets.Dataset.from_dict({"i": list(range(len(trajs)))})
            raw = table.to_iterable_dataset() if streaming else table
        else:
            raw = [{"i": i} for i in range(len(trajs))]
        return Rows(raw, source, "synthetic", ["i"], lambda row, where, i: trajs[row["i"]])
    raw, name = read_table(source, split, streaming) if arrow or streaming else read_rows(source, split)
    first = next(iter(raw), None) if streaming else (raw[0] if len(raw) else None)
    if first is None:
        raise DataError(f"{name}: has no rows")
    fmt = detect_format(first, f"{name} row 1") if fmt == "auto" else fmt
    return Rows(
        raw,
        name,
        fmt,
        getattr(raw, "column_names", None) or list(first if isinstance(first, dict) else []),
        row_converter(fmt, split_rule),
    )


def skip_reason(error: str, where: str) -> str:
    """An error message without its row and numbers, so that skipped rows can be counted by kind."""
    reason = re.sub(r"\[[\d, ]*\]", "[...]", error.removeprefix(where).lstrip(" :"))
    return re.sub(r"\d+", "N", reason)


PLURALS = {"row": "rows", "trajectory": "trajectories"}


def skip_report(name: str, errors: list[tuple[int, str]], total: int, unit: str = "row") -> str:
    """The one wording of skipped input: skipped rows counted by kind of error, each kind shown by its first
    row's own message (which starts with "NAME UNIT N"):
    "NAME: skipped 3 of 9 rows: 2 rows like row 5 (field 'labels' has 1 labels for 2 steps); row 9 (field 'prompt' is
    missing)"."""
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
    source: str,
    fmt: str = "auto",
    split: str = "train",
    skip_invalid: bool = False,
    split_rule: str | Segmenter = "auto",
    labelled: bool = False,
) -> tuple[list[Trajectory], dict[str, int]]:
    """Trajectories of every row, and how many rows were skipped for each reason (empty unless skip_invalid).

    Rows are numbered from 1 in file order in messages; a BoN row's index from 0 is its qid.
    `labelled` refuses trajectories without step labels, as training needs them.
    """
    rows = open_source(source, fmt, split, split_rule)
    name = rows.name
    trajs: list[Trajectory] = []
    errors: list[tuple[int, str]] = []
    for i, row in enumerate(rows.raw):
        where = f"{name} row {i + 1}"
        try:
            if not isinstance(row, dict):
                raise DataError(f"{where}: is a {type(row).__name__}, expected an object")
            got = rows.convert(row, where, i)
        except DataError as e:
            if not skip_invalid:
                raise
            errors.append((i + 1, str(e)))
            continue
        trajs.extend(got if isinstance(got, list) else [got])
    if errors:
        log.warning(skip_report(name, errors, len(rows.raw)))
    if labelled:
        missing = next((i for i, t in enumerate(trajs) if t.labels is None), None)
        if missing is not None:
            raise DataError(f"{source} row {missing + 1}: field 'labels' is missing; training needs step labels")
    return trajs, dict(Counter(skip_reason(e, f"{name} row {row}") for row, e in errors))


def load_trajectories(
    source: str,
    fmt: str = "auto",
    split: str = "train",
    skip_invalid: bool = False,
    split_rule: str | Segmenter = "auto",
    labelled: bool = False,
) -> list[Trajectory]:
    """`load_with_report` without the report (skips are still logged as a warning)."""
    return load_with_report(source, fmt, split, skip_invalid, split_rule, labelled)[0]
