"""Benchmark files -> trajectories: the GSM8K Best-of-N pool, candidate files, gold answers, ProcessBench subsets.

A pool spec is `gsm8k_bon_small` (the local 12-candidate GSM8K pool), one of its one-style
sub-pools `gsm8k_bon_small:gpt3|abel|metamath` (`SUBPOOLS`), a candidates file
in our layout or PQM's, or `hf://OWNER/REPO/PATH` (a file in a Hugging Face model repo,
where PQM keeps its 128-candidate sets). `SPEC@QUESTIONS` names where gold answers come
from when the candidates carry none: `gsm_plus`, `math500`, `gsm8k` (files under the
data root), a local file, or a Hub dataset `NAME[:CONFIG]`. Questions are matched to
the pool by position and checked by text, as PQM's evaluation does. Grading the
candidates is the evaluation wing's (`biprm.evaluation.pools`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from biprm.config import PROCESSBENCH_SUBSETS
from biprm.data.names import distinct_labels, refuse_repeats
from biprm.data.segment import Segmenter
from biprm.data.readers import EMPTY_RESPONSE, checked_field, load_trajectories, read_rows, solution_steps
from biprm.data.trajectory import DataError, Trajectory, validate

# One-style sub-pools of gsm8k_bon_small (candidate positions in its fixed policy order): the full pool
# stacks 12 policies, so its first n candidates are a choice of policies, not a sample of one.
SUBPOOLS = {"gpt3": (0, 1, 2, 3), "abel": (4, 5, 6), "metamath": (9, 10, 11)}
QUESTION_SETS = {
    "gsm_plus": "gsm_plus/gsmplus_testmini.jsonl",
    "math500": "math500/test.jsonl",
    "gsm8k": "gsm8k/test.jsonl",
}

logger = logging.getLogger(__name__)


def data_file(root: str | Path, *parts: str) -> Path:
    """A benchmark file under the data root, or an error that says how to point biprm at the data."""
    if not Path(root).is_dir():
        raise FileNotFoundError(
            f"benchmark data folder {root} not found: pass --data-root DIR or set BIPRM_DATA=DIR "
            "(DIR holds processbench/, prmbench/, gsm8k/, gsm8k_bon_small/ ...)"
        )
    return Path(root, *parts)


def spread(n: int, limit: int | None) -> np.ndarray:
    """`limit` indices evenly spaced over range(n)."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.arange(limit) * n // max(limit, 1)


def balanced_slice(clean: np.ndarray, limit: int | None) -> np.ndarray:
    """`limit` rows in file order, evenly spaced within clean and within erroneous rows, keeping the
    subset's share of clean ones (at least one of each kind from limit 2 on). ProcessBench lists its
    rows by final-answer correctness, so a plain head or even spread can miss a kind entirely."""
    if limit is None or limit >= len(clean):
        return np.arange(len(clean))
    ok, wrong = np.flatnonzero(clean), np.flatnonzero(~clean)
    k = round(limit * len(ok) / len(clean))
    if limit >= 2:
        k = min(max(k, int(len(ok) > 0)), limit - int(len(wrong) > 0))
    return np.sort(np.concatenate([ok[spread(len(ok), k)], wrong[spread(len(wrong), limit - k)]]))


def _hub_file(spec: str) -> str:
    """hf://OWNER/REPO/PATH -> a local copy (Hub access needed); anything else unchanged."""
    if not spec.startswith("hf://"):
        return spec
    from huggingface_hub import hf_hub_download

    owner, repo, path = spec.removeprefix("hf://").split("/", 2)
    return hf_hub_download(f"{owner}/{repo}", path)


# ---- the local GSM8K Best-of-N pool ----------------------------------------------------

OPENAI_POLICIES = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
GSMPLUS_POLICIES = (
    "abel_7b",
    "abel_13b",
    "abel_70b",
    "gpt-3.5-turbo",
    "gpt4",
    "metamath_7b",
    "metamath_13b",
    "metamath_70b",
)


def _column(
    rows: list[dict],
    name: str,
    questions: list[str],
    question_key: str,
    text_key: str,
    flag_key: str,
    nested: str | None = None,
) -> list[tuple[str, bool]]:
    """(solution, is_correct) per question, after checking the file is aligned with gsm8k/test.jsonl."""
    if len(rows) != len(questions):
        raise DataError(f"{name}: has {len(rows)} rows, expected {len(questions)} (one per GSM8K test question)")
    column = []
    for i, (row, question) in enumerate(zip(rows, questions)):
        where = f"{name} row {i + 1}"
        if question not in checked_field(row, question_key, where, str):
            raise DataError(f"{where}: field '{question_key}' does not match question {i + 1} of gsm8k/test.jsonl")
        sample, at = (checked_field(row, nested, where, dict), f"{where} {nested}") if nested else (row, where)
        column.append((checked_field(sample, text_key, at, str), checked_field(sample, flag_key, at, bool)))
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
        solution = checked_field(row, "answer", where, str)
        if "####" not in solution:
            raise DataError(f"{where}: field 'answer' has no '#### N' final answer")
        questions.append(checked_field(row, "question", where, str))
        golds.append(solution.rsplit("####", 1)[1].strip().replace(",", ""))

    pool = root / "gsm8k_bon_small"
    rows, name = read_rows(str(pool / "openai_example_model_solutions.jsonl.gz"))
    columns = [
        (p, _column(rows, name, questions, "question", "solution", "is_correct", nested=p)) for p in OPENAI_POLICIES
    ]
    for policy in GSMPLUS_POLICIES:
        rows, name = read_rows(str(pool / f"gsmplus_repo_gsm8k_pred_{policy}.json.gz"))
        keys = ("input", "completion") if policy.startswith("metamath") else ("question", "model_prediction")
        columns.append((policy, _column(rows, name, questions, *keys, "result")))

    trajs = []
    for qid, (question, gold) in enumerate(zip(questions, golds)):
        for cand, (policy, column) in enumerate(columns):
            text, correct = column[qid]
            traj = Trajectory(
                question,
                solution_steps(text),
                answer=gold,
                correct=correct,
                meta={"qid": qid, "cand": cand, "policy": policy},
            )
            trajs.append(validate(traj, f"{pool} question {qid + 1} candidate {policy}"))
    empty = sum(t.steps == [EMPTY_RESPONSE] for t in trajs)
    if empty:
        logger.warning(
            "%s: %d candidates have no text; each is kept as the single step %r", pool, empty, EMPTY_RESPONSE
        )
    return trajs


def _gold(row: dict, where: str) -> tuple[str, str]:
    """(question, gold answer) of a GSM-Plus / MATH500 / GSM8K row; GSM8K keeps its answer after '####'."""
    question, answer = row.get("question") or row.get("problem"), row.get("answer")
    if not isinstance(question, str) or not question.strip() or answer is None:
        raise DataError(f"{where}: needs 'question' (or 'problem') and 'answer'; a question is non-empty text")
    answer = str(answer)
    return question, answer.rsplit("####", 1)[1].strip() if "####" in answer else answer


def question_golds(spec: str, data_root: str, split: str = "test") -> tuple[list[tuple[str, str]], str]:
    """((question, gold) per row of a question set, the set's name): a name of QUESTION_SETS or any file biprm reads."""
    source = str(data_file(data_root, QUESTION_SETS[spec])) if spec in QUESTION_SETS else spec
    rows, name = read_rows(source, split)
    return [_gold(row, f"{name} row {i + 1}") for i, row in enumerate(rows)], name


def _attach_golds(trajs: list[Trajectory], spec: str, data_root: str, split: str) -> None:
    golds, name = question_golds(spec, data_root, split)
    position = {q: i for i, q in enumerate(dict.fromkeys(t.meta["qid"] for t in trajs))}
    if len(golds) != len(position):
        raise DataError(f"{name}: has {len(golds)} questions, the pool {len(position)}; they are matched by position")
    for t in trajs:
        i = position[t.meta["qid"]]
        question, gold = golds[i]
        if question.strip() != t.question.strip():
            raise DataError(f"{name} row {i + 1}: question differs from question {i + 1} of the pool")
        if t.answer is None:
            t.answer = gold


def load_candidates(
    spec: str,
    data_root: str,
    limit: int | None = None,
    questions: str | None = None,
    questions_split: str = "test",
    split_rule: str | Segmenter = "auto",
) -> tuple[list[Trajectory], str, str]:
    """(candidates of `limit` questions spread over the pool, the pool's name, the spec without @QUESTIONS); golds
    attached from `questions` (or the spec's @QUESTIONS) where the candidates carry none."""
    spec, _, at = spec.partition("@")
    questions = questions or at or None
    if spec.split(":")[0] == "gsm8k_bon_small":
        trajs, name = gsm8k_bon_small(data_root), spec
        style = spec.partition(":")[2]
        if style:
            if style not in SUBPOOLS:
                raise ValueError(
                    f"unknown sub-pool {spec!r}; choose gsm8k_bon_small or gsm8k_bon_small:STYLE, STYLE in "
                    f"{sorted(SUBPOOLS)}"
                )
            trajs = [t for t in trajs if t.meta["cand"] in SUBPOOLS[style]]
    else:
        trajs, name = (
            load_trajectories(_hub_file(spec), fmt="bon", split_rule=split_rule),
            Path(spec).name.split(".")[0],
        )
    if questions:
        _attach_golds(trajs, questions, data_root, questions_split)
    qids = list(dict.fromkeys(t.meta["qid"] for t in trajs))
    keep = {qids[i] for i in spread(len(qids), limit)}
    trajs = [t for t in trajs if t.meta["qid"] in keep]
    return trajs, name, spec


def processbench_files(data_root: str, subsets: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """{subset label: its file}: one of ProcessBench's four names, or a file in its layout labelled by its name without
    extensions, grown by parent folders where two files (or a file and a built-in subset) share it ("a/bench",
    "b/bench"). Two that are the same file are refused: their rows would count twice."""
    paths, fixed = [], {}
    for i, name in enumerate(subsets):
        path = Path(name).expanduser()
        if not path.is_file():
            if name not in PROCESSBENCH_SUBSETS:
                raise ValueError(f"unknown ProcessBench subset {name!r}: not a file, nor one of {PROCESSBENCH_SUBSETS}")
            path, fixed[i] = data_file(data_root, "processbench", f"{name}.json"), name
            if not path.is_file():
                raise FileNotFoundError(f"{path}: ProcessBench subset not found; pass --data-root (or set $BIPRM_DATA)")
        paths.append(str(path))
    resolved = refuse_repeats(paths, "subset")
    return {label: Path(p) for label, p in zip(distinct_labels(resolved, stem=True, fixed=fixed), resolved)}


def load_processbench(
    data_root: str, subsets: tuple[str, ...] = PROCESSBENCH_SUBSETS, limit: int | None = None
) -> list[Trajectory]:
    """The chosen subsets in one list, each row tagged meta["subset"]; `limit` rows per subset via `balanced_slice`.

    A subset is one of ProcessBench's four names, or the path of any file in ProcessBench's
    layout (problem, steps, label), which is then named by its file name.
    """
    out = []
    for name, path in processbench_files(data_root, subsets).items():
        trajs = load_trajectories(str(path), fmt="processbench")
        for i in balanced_slice(np.array([t.meta["first_error"] == -1 for t in trajs]), limit):
            trajs[i].meta["subset"] = name
            out.append(trajs[i])
    return out


def gsm8k_reference(question: str, answer: str, where: str) -> Trajectory:
    """A GSM8K solution as steps: one per line, calculator notes dropped, "#### N" -> "The answer is N."."""
    if not isinstance(answer, str) or "####" not in answer:
        raise DataError(f"{where}: field 'answer' has no '#### N' final answer")
    steps = solution_steps(answer, "newline")
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
    traj = Trajectory(question, steps, [1.0] * len(steps), answer=gold, meta={"source": "gsm8k", "kind": "reference"})
    return validate(traj, where)
