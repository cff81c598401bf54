"""Final-answer extraction and grading with math-verify.

math-verify bounds its own run time with SIGALRM, which only works in the main thread,
so here parse/verify always run with their timeouts off and `grade_many` bounds time
with a process pool instead (a hung worker is killed and its pool rebuilt).

Conventions:
- Numbers are normalised: no thousands separators, currency signs or trailing decimal
  zeros, a unicode minus becomes "-", ".5" becomes "0.5". A percent sign is kept
  ("12.5%"): math-verify counts "12.5%" equal to both 12.5 and 0.125, so a GSM8K gold
  "25" accepts "25%" and a gold "0.25" does too.
- Gold "None" (GSM-Plus critical-thinking items) is matched only by a prediction that
  says so ("None", "no answer", ...). A missing prediction (None) is always wrong.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import signal
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Literal

from math_verify import parse, verify

from biprm.evaluation.prose import NUMBER_IN_TEXT, Reading, canonical_number, read_prose

logger = logging.getLogger(__name__)

# We disable math-verify's timeouts on purpose; its one-off warning about that is noise.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(lambda r: "Timeout is disabled" not in r.getMessage())

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_ANSWER_IS = re.compile(
    r"\banswer is\b[ \t]*:?[ \t]*([^\n]+)", re.IGNORECASE
)  # one line: "answer is:\n\nThe answer is 3" is not an answer
# anywhere in a line ("Therefore, Claire will eat #### 7 dozen eggs"), up to the line's end or its next "####"
_HASHES = re.compile(r"####[ \t]*((?:(?!####)[^\n])*)")
_SENTENCE_END = re.compile(r"\.\s")
_LAST_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_MATH_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_TEXT_CMD = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{(.*)\}$")
_WORD_ONLY = re.compile(r"\(?[A-Za-z][A-Za-z ]*\)?")
_NO_ANSWER = {"none", "no answer", "no solution", "not enough information", "cannot be determined"}
Pair = tuple[str, str | None]
Reads = Literal["marked", "fallback"]  # how read_answer found an answer
_CACHE: dict[Pair, bool] = {}
_CACHE_MAX = 200_000
# Seconds per item on top of `timeout`, so that a chunk of fast items never trips it.
_CHUNK_ALLOWANCE = 0.25


def _strip_math(text: str) -> str:
    """Drop whitespace, a trailing period and $...$-style delimiters around an answer."""
    text = text.strip().rstrip(".").strip()
    for left, right in _MATH_WRAPPERS:
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            return text[len(left) : -len(right)].strip().rstrip(".").strip()
    return text


def _read(answer: str, question: str | None) -> Reading | None:
    """An answer's number, or its text when it is maths; Reading(None) when it is prose that cannot be read
    (unknown); None when it is empty."""
    text = _strip_math(answer).replace("\u2212", "-").lstrip("#: \t")
    if not text:
        return None
    number = canonical_number(text)
    if number is None and not re.search("[A-Za-z]", text):
        number = canonical_number(text.rsplit("=", 1)[-1])  # "84 - 84 = 0": its last side
    if number is not None:
        return Reading(number)
    return read_prose(text, question) or Reading(text)


def _last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...}; a truncated one is skipped.

    One pass over the braces with a stack, so hostile text (thousands of unclosed
    \\boxed{) costs linear time, not a rescan from every opening.
    """
    content_at = {m.end() - 1: m.end() for m in _BOXED.finditer(text)}  # a boxed's "{" -> where its content starts
    stack: list[int] = []
    last: tuple[int, int] | None = None
    for m in _BRACE.finditer(text):
        if m[0] == "{":
            stack.append(m.start())
        elif stack:
            opened = stack.pop()
            if opened in content_at and (last is None or opened > last[0]):
                last = (opened, m.start())
    return None if last is None else text[content_at[last[0]] : last[1]]


def extract_answer(solution: str, question: str | None = None) -> str | None:
    """The final answer as a person reads it: the last \\boxed{}, else "The answer is ...", else "#### ..." (anywhere
    in a line), else the last sentence's number. Prose is read by `prose.read_prose`, which needs `question` for
    amounts whose number depends on the unit asked for ("7 dozen"). None: no answer, or one that cannot be
    read (unknown); never a guessed number."""
    return read_answer(solution, question)[0]


def read_answer(solution: str, question: str | None = None) -> tuple[str | None, Reads | None]:
    """`extract_answer`'s answer and how it was read: "marked" (a box, "The answer is", "####") or "fallback" (the last
    sentence's number, the GSM8K convention), None with no answer. A table says which right answers rest on the
    fallback:
    a path cut off mid-solution has a last number too."""
    boxed = _last_boxed(solution)
    marked = [boxed] if boxed is not None else []
    marked += [_SENTENCE_END.split(m[1], maxsplit=1)[0] for m in reversed(list(_ANSWER_IS.finditer(solution)))]
    marked += [_SENTENCE_END.split(m[1], maxsplit=1)[0] for m in reversed(list(_HASHES.finditer(solution)))]
    for answer in marked:
        if (reading := _read(answer, question)) is not None:
            return reading.value, "marked" if reading.value is not None else None
    for sentence in reversed(_LAST_SENTENCE.split(solution)):
        if (reading := read_prose(sentence, question, marked=False)) is not None:
            return reading.value, "fallback" if reading.value is not None else None
        if numbers := list(NUMBER_IN_TEXT.finditer(sentence)):
            return canonical_number(numbers[-1][0]), "fallback"
    return None, None


def _says_none(answer: str) -> bool:
    text = _strip_math(answer)
    if m := _TEXT_CMD.match(text):
        text = m[1]
    return text.strip().strip(".").lower() in _NO_ANSWER


def _to_parsable(answer: str) -> str | None:
    """Wrap an answer so that math-verify reads all of it; None for prose that cannot be read (unknown).

    Prose with a number in it is read as a person reads it (`prose.read_prose`, without the question). Bare LaTeX is not
    seen at all ("\\sqrt{2}" parses to nothing) or only in part ("10\\sqrt{2}" parses to 10), so LaTeX goes inside
    $...$. Other prose is left bare: in math mode its words would become a product of symbols. Lone words become
    \\text{} so that "Evelyn" matches a gold "\\text{Evelyn}".
    """
    text = _strip_math(answer).replace("\u2212", "-")
    if (number := canonical_number(text)) is not None:
        return number
    if (reading := read_prose(text)) is not None:
        return reading.value
    if "\\" in text or any(c in text for c in "^_{}"):
        return f"${text}$"
    if _WORD_ONLY.fullmatch(text):
        return f"$\\text{{{text}}}$"
    if re.search(r"[A-Za-z]{2,}", text):
        return text
    return f"${text}$"


def grade(gold: str, pred: str | None) -> bool:
    """math-verify's verdict, gold first (the comparison is not symmetric)."""
    if pred is None or not pred.strip():
        return False
    if _says_none(gold):
        return _says_none(pred)
    gold_text, pred_text = _to_parsable(gold), _to_parsable(pred)
    if gold_text is None or pred_text is None:
        return False
    gold_parsed = parse(gold_text, parsing_timeout=None)
    pred_parsed = parse(pred_text, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def grade_solution(gold: str, solution: str, question: str | None = None) -> bool:
    """Grade a whole generated solution, as Best-of-N needs; an answer it cannot read counts as wrong."""
    return grade(gold, extract_answer(solution, question))


def solution_verdict(gold: str, solution: str, question: str | None = None) -> Literal["correct", "wrong", "unknown"]:
    """A whole solution's grade with "unknown" kept apart: no answer, or prose that cannot be read. Use it to
    count what the grader could not read instead of folding it into "wrong"."""
    answer = extract_answer(solution, question)
    if answer is None:
        return "unknown"
    return "correct" if grade(gold, answer) else "wrong"


def _grade_chunk(pairs: list[Pair]) -> list[bool]:
    return [grade(gold, pred) for gold, pred in pairs]


def _leave_interrupt_to_parent() -> None:
    """A terminal's Ctrl-C reaches every process of its group: a grading worker ignores it, and the command that runs
    it stops in one line, without a traceback from each worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _new_pool(workers: int) -> ProcessPoolExecutor:
    """A spawned pool, warmed up so that import time does not eat the first deadlines."""
    pool = ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_leave_interrupt_to_parent
    )
    wait([pool.submit(_grade_chunk, [("1", "1")]) for _ in range(workers)], timeout=120)
    return pool


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """shutdown() alone would wait for (or leave running) a worker stuck in sympy."""
    processes = list(pool._processes.values())  # no public handle on the workers
    for process in processes:
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(5)


def _drain(
    pool: ProcessPoolExecutor,
    queue: deque[list[int]],
    todo: list[Pair],
    verdicts: list[bool],
    failed: list[int],
    workers: int,
    timeout: float,
) -> None:
    """Grade queued chunks until the queue is empty or one fails; a failure requeues work.

    At most `workers` chunks are in flight, so a chunk starts about when it is submitted.
    A chunk past its deadline (or one whose worker died) is split into single items, which
    then run on a fresh pool; a single item that fails again is counted wrong.
    """
    running: dict[Future, tuple[list[int], float]] = {}
    while queue or running:
        while queue and len(running) < workers:
            idx = queue.popleft()
            try:
                future = pool.submit(_grade_chunk, [todo[i] for i in idx])
            except BrokenProcessPool:
                if not running:  # nothing of ours broke it: a broken environment, not an item
                    raise
                queue.appendleft(idx)
                break
            running[future] = (idx, time.monotonic() + timeout + _CHUNK_ALLOWANCE * len(idx))
        first_deadline = min(deadline for _, deadline in running.values())
        wait(running, max(0.0, first_deadline - time.monotonic()), FIRST_COMPLETED)
        now, bad = time.monotonic(), []
        for future, (idx, deadline) in list(running.items()):
            if future.done() and future.exception() is None:
                for i, verdict in zip(idx, future.result()):
                    verdicts[i] = verdict
            elif future.done() or now >= deadline:
                bad.append(idx)
            else:
                continue
            del running[future]
        if bad:
            for idx in bad:
                if len(idx) == 1:
                    failed.append(idx[0])
                else:
                    queue.extendleft([i] for i in reversed(idx))
            queue.extend(idx for idx, _ in running.values())
            return


def _run_pool(todo: list[Pair], workers: int, timeout: float) -> tuple[list[bool], list[int]]:
    """Verdicts for `todo` and the positions that timed out or crashed a worker."""
    size = max(1, min(64, len(todo) // (workers * 4)))
    queue = deque(list(range(i, min(i + size, len(todo)))) for i in range(0, len(todo), size))
    verdicts, failed = [False] * len(todo), []
    while queue:
        pool = _new_pool(workers)
        try:
            _drain(pool, queue, todo, verdicts, failed, workers, timeout)
        finally:
            _kill_pool(pool)
    return verdicts, failed


def grade_many(pairs: list[Pair], workers: int = 2, timeout: float = 5.0) -> list[bool | None]:
    """grade() over many pairs, each bounded by `timeout` seconds (workers=0: inline, unbounded).

    An item that times out (or crashes its worker) is None, never a verdict: it is logged by
    index and kept out of the in-memory cache, so the caller can report it and try again.
    """
    pairs = [(gold, pred) for gold, pred in pairs]
    known = {p: v for p in dict.fromkeys(pairs) if (v := _CACHE.get(p)) is not None}
    todo = [p for p in dict.fromkeys(pairs) if p not in known]
    if workers <= 0 or not todo:
        verdicts, failed = _grade_chunk(todo), []
    else:
        verdicts, failed = _run_pool(todo, workers, timeout)
    for position in failed:
        indices = [i for i, p in enumerate(pairs) if p == todo[position]]
        logger.warning("grading timed out (%g s) or crashed for item(s) %s", timeout, indices)
    lost = set(failed)
    fresh = {p: v for k, (p, v) in enumerate(zip(todo, verdicts)) if k not in lost}
    if len(_CACHE) + len(fresh) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE.update(fresh)
    known.update(fresh)
    return [known.get(p) for p in pairs]
