"""Segmenters: the one place where a trace's text is cut into steps.

Every splitter of biprm goes through here: the readers' split rules, the server's `split`, a search's step token and
the segmenters a long trace is cut with (docs/LONG_TRACES.md):

- `given`: the row's own steps (a row that gives one string has none to give);
- `paragraph`: blank lines; `lines`: newlines;
- `markers`: ThinkBooster's transition-marker rule: a step starts at a sentence that opens with a sequence,
  conclusion, thinking, verification or reasoning marker ("So", "Wait,", "Let me", "To verify", ...), never at one
  that opens with but/however/alternatively, and steps are kept within 100-600 characters (`Markers` holds the word
  lists and the bounds);
- `tokens:N`: N tokens of the model's tokenizer per step.

Each step comes back with its character span in the text it was cut from, so a score maps back to the text. Steps
given as a list are laid end to end with `JOIN` between them: their spans are in that text, and a segmenter other
than `given` re-cuts it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

from biprm.config import SPLIT_NAMES, check_segmenter, tokens_per_step
from biprm.data.trajectory import DataError

JOIN = "\n\n"  # between given steps, in the text their spans point into
MS_TAG = "ки"  # Math-Shepherd's step tag (Cyrillic, U+043A U+0438)
RULES = SPLIT_NAMES  # the readers' and the server's split rules, kept as they were (names in biprm.config)
FALLBACK = "auto"  # what cuts a one-string trace for a model whose steps were given (reported in the output)

MARKERS = (
    "first",
    "then",
    "next",
    "finally",  # sequence
    "so",
    "therefore",
    "thus",
    "hence",  # conclusion
    "let me",
    "let's",
    "wait",
    "hmm",
    "okay",
    "actually",  # thinking
    "to verify",
    "let's check",
    "substituting",  # verification
    "for example",
    "given that",
    "similarly",  # reasoning
)
NEVER = ("but", "however", "alternatively")  # splitting on these over-splits (ThinkBooster)


class Span(NamedTuple):
    """One step: its text (stripped) and where that text lies in the trace, text == trace[start:end]."""

    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Cut:
    """A trace's steps, the segmenter that cut them, and the fallback it took instead, if any (said in the output)."""

    steps: list[Span]
    segmenter: str
    fallback: str | None = None

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.steps]

    @property
    def offsets(self) -> list[list[int]]:
        return [[s.start, s.end] for s in self.steps]

    def meta(self) -> dict:
        """What travels with the scores (the row's meta): the segmenter, each step's [start, end), and any fallback."""
        return {"segmenter": self.segmenter, "offsets": self.offsets} | (
            {"segmenter_fallback": self.fallback} if self.fallback else {}
        )


@dataclass(frozen=True)
class Markers:
    """The marker rule's settings: words that open a step, words that never do, and the step length bounds
    (characters)."""

    markers: tuple[str, ...] = MARKERS
    never: tuple[str, ...] = NEVER
    min_chars: int = 100
    max_chars: int = 600

    def __post_init__(self) -> None:
        if not 0 < self.min_chars < self.max_chars:
            raise ValueError(f"markers: need 0 < min_chars < max_chars, got {self.min_chars} and {self.max_chars}")
        if not self.markers:
            raise ValueError("markers: the marker list is empty")


def spans(text: str, cuts: list[int]) -> list[Span]:
    """The pieces of `text` between the cut points (sorted character positions), stripped; blank pieces are not
    steps."""
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        piece = text[a:b]
        body = piece.strip()
        if body:
            start = a + len(piece) - len(piece.lstrip())
            out.append(Span(body, start, start + len(body)))
    return out


def step_at(offsets: list[list[int]], char: int) -> int:
    """The step whose [start, end) holds character `char` of the trace; where `char` falls between two steps, the next
    one; -1 past the last. How a position in the text (a labelled first error, or the start of a step of another cut)
    lands on these steps."""
    return next((t for t, (_, end) in enumerate(offsets) if char < end), -1)


def first_error_on(first_error: int, cut: list[list[int]], given: list[list[int]]) -> int:
    """A first error predicted on one cut of a trace (step index, -1 for none) as a step of another cut of the same
    text: the step of `given` that holds the first character of the predicted step, so first-error F1 compares across
    segmenters on the given steps' labels."""
    return -1 if first_error < 0 else step_at(given, cut[first_error][0])


def by_pattern(text: str, pattern: re.Pattern) -> list[Span]:
    """Cut where `pattern` matches; the matched text belongs to no step."""
    out, at = [], 0
    for m in pattern.finditer(text):
        out += [Span(s.text, s.start + at, s.end + at) for s in spans(text[at : m.start()], [])]
        at = m.end()
    return out + [Span(s.text, s.start + at, s.end + at) for s in spans(text[at:], [])]


def separator(token: str) -> Callable[[str], list[Span]]:
    """Cut at every occurrence of a literal string (a search's step token, Math-Shepherd's tag)."""
    if not token:
        raise ValueError("the step token must not be empty")
    pattern = re.compile(re.escape(token))
    return lambda text: by_pattern(text, pattern)


PARAGRAPH = re.compile(r"\n\s*\n")
LINE = re.compile(r"\n")
_SENTENCE = re.compile(r"(?:(?<=[.!?])[ \t]+|\n\s*)(?=\S)")  # what ends a sentence: .!? then spaces, or a line break


def _words(words: tuple[str, ...]) -> re.Pattern:
    """Any of `words` at the start, as whole words, any case; an apostrophe matches a typographic one too."""
    alternatives = sorted((re.escape(w).replace("'", "['’]") for w in words), key=len, reverse=True)
    return re.compile(rf"(?i:{'|'.join(alternatives)})\b")


def markers(text: str, rule: Markers = Markers()) -> tuple[list[Span], str | None]:
    """ThinkBooster's marker rule: cut before every sentence that opens with a marker, merge steps shorter than
    `min_chars` into the next one (the last into the one before), then cut steps longer than `max_chars` at the last
    sentence start that fits (else the last space, else at `max_chars`). A trace where no marker opens a sentence is
    cut by the length rule alone, and the fallback says so."""
    opens, never = _words(rule.markers), _words(rule.never)
    starts = [m.end() for m in _SENTENCE.finditer(text)]
    cuts = [p for p in starts if opens.match(text, p) and not never.match(text, p)]
    merged: list[tuple[int, int]] = []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        if merged and len(text[merged[-1][0] : merged[-1][1]].strip()) < rule.min_chars:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    if len(merged) > 1 and len(text[merged[-1][0] : merged[-1][1]].strip()) < rule.min_chars:
        tail = merged.pop()
        merged[-1] = (merged[-1][0], tail[1])
    free = [p for p in starts if not never.match(text, p)]
    bounds = [p for a, b in merged for p in ([a] if a else []) + _within(text, a, b, free, rule)]
    fallback = (
        None if cuts else f"no marker opens a sentence: cut at sentence starts within {rule.max_chars} characters"
    )
    return spans(text, bounds), fallback


def _within(text: str, a: int, b: int, free: list[int], rule: Markers) -> list[int]:
    """Cut points that keep the piece text[a:b] within `max_chars`, each piece at least `min_chars` where it can be."""
    cuts = []
    while b - a > rule.max_chars:
        lo, hi = a + rule.min_chars, a + rule.max_chars
        at = max((p for p in free if lo < p <= hi), default=None)
        if at is None:
            space = text.rfind(" ", lo, hi + 1)
            at = space + 1 if space > lo else hi
        cuts.append(at)
        a = at
    return cuts


def tokens(text: str, n: int, tokenizer) -> list[Span]:
    """Steps of `n` tokens of `tokenizer` (the last may be shorter), cut where a token starts."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return spans(text, [offsets[k][0] for k in range(n, len(offsets), n)])


def _auto(text: str) -> list[Span]:
    """The readers' default: Math-Shepherd tags if present, else paragraphs if there are at least two, else lines."""
    if MS_TAG in text:
        return separator(MS_TAG)(text)
    paragraphs = by_pattern(text, PARAGRAPH)
    return paragraphs if len(paragraphs) >= 2 else by_pattern(text, LINE)


class Segmenter:
    """A segmenter by name (SEGMENTERS, or one of the readers' RULES); `tokens:N` needs the model's tokenizer. `note`: a
    fallback declared by whoever chose this segmenter, reported with every cut (see `for_model`)."""

    def __init__(self, name: str, tokenizer=None, rule: Markers = Markers(), note: str | None = None):
        self.name, self.tokenizer, self.rule, self.note = name, tokenizer, rule, note
        check_segmenter(name)
        self.tokens_per_step = tokens_per_step(name)

    def __repr__(self) -> str:
        return f"Segmenter({self.name!r})"

    def text(self, text: str) -> tuple[list[Span], str | None]:
        """The steps of one text, and the fallback taken, if any; no checks (an empty text has no steps)."""
        if self.tokens_per_step is not None:
            if self.tokenizer is None:
                raise ValueError(f"segmenter {self.name!r} counts the model's tokens: give it the model's tokenizer")
            return tokens(text, self.tokens_per_step, self.tokenizer), None
        if self.name == "markers":
            return markers(text, self.rule)
        cut = {"paragraph": PARAGRAPH, "double-newline": PARAGRAPH, "lines": LINE, "newline": LINE}.get(self.name)
        if cut is not None:
            return by_pattern(text, cut), None
        if self.name == MS_TAG:
            return separator(MS_TAG)(text), None
        if self.name == "auto":
            return _auto(text), None
        raise ValueError(f"segmenter 'given' keeps a row's own steps; a text has none (use {FALLBACK!r} or another)")

    def cut(self, trace: str | list[str], where: str) -> Cut:
        """A row's trace (one string, or its steps) cut into steps; a bad trace raises DataError naming `where`."""
        if isinstance(trace, list):
            if not trace or any(not isinstance(s, str) or not s.strip() for s in trace):
                raise DataError(f"{where}: field 'steps' is empty or holds an empty step")
            if self.name == "given":
                ends = [len(JOIN.join(trace[: t + 1])) for t in range(len(trace))]
                return Cut([Span(s, e - len(s), e) for s, e in zip(trace, ends)], "given")
            trace = JOIN.join(trace)
        if not isinstance(trace, str) or not trace.strip():
            raise DataError(f"{where}: the trace is empty")
        if self.name == "given":
            raise DataError(
                f"{where}: segmenter 'given' keeps a row's own steps, and this row gives one string; "
                f"cut it with paragraph, lines, markers or tokens:N"
            )
        steps, fallback = self.text(trace)
        if not steps:
            raise DataError(f"{where}: segmenter {self.name!r} cut the trace into zero steps")
        return Cut(steps, self.name, fallback or self.note)


def for_model(chosen: str | None, trained: str, tokenizer=None) -> Segmenter:
    """The segmenter of a scoring run: the one chosen, else the one the model was trained with. A model trained on
    given steps has none to offer for a one-string trace, so `FALLBACK` cuts it, and each such row says so."""
    name = chosen or trained
    if name != "given" or chosen:
        return Segmenter(name, tokenizer)
    return Segmenter(
        FALLBACK,
        tokenizer,
        note=f"the model was trained on given steps: this trace was cut by {FALLBACK!r} "
        "(tags, else paragraphs, else lines)",
    )
