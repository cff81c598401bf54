"""Reading a final answer written as prose, the way a person reads it (docs/EVALUATION.md, "Prose answers").

math-verify reads the last number of a sentence, so "7 dozen eggs in 4 weeks" gives 4 and "2 hours and 30
minutes" gives 30. Here an answer is read by clauses and by what follows its number:

- "X more than Y, so Z": after "so" (therefore, thus, hence) only the last clause counts;
- "A, which is B" (that is, i.e., or, "=", a parenthesis): B, the restatement; when A and B name different
  units ("2 hours, which is 120 minutes") the question's unit decides, and without the question it is unknown;
- a marked answer opens with its number ("#### 240 5 dollar bills"); a last sentence ends with it, skipping
  numbers that only modify it ("84 eggs in 4 weeks");
- "N and a half" is N + 1/2; "N million" (thousand, billion) is N × 10^6, or N where the question asks
  "in millions";
- "N dozen" and "N hours and M minutes" (and other two-unit amounts) depend on the unit the question asks
  for, so they are read only with the question, and are unknown without it;
- numbers in words ("twelve", "two hundred and five", "a dozen").
- signs in words: "negative N", "minus N" and "N (degrees) below zero" are -N; a number joined to another by an
  operator ("5 minus 2", "10 - 4 apples") is part of an expression, not an answer, and "minus" after a name
  ("his age minus 5") is no sign.

What cannot be read this way is unknown (`Reading(None)`), never a guessed number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction

# A number as answers write it: sign, currency, thousands separators, a fraction bar, a percent sign.
NUMBER = (
    r"(?P<s1>[-\u2212])?(?:\\?\$\s*)?(?P<s2>[-\u2212])?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+))?(?P<pct>\s*\\?%)?"
)
_NUMBER_FULL = re.compile(NUMBER)
NUMBER_IN_TEXT = re.compile(r"(?<![\w.])" + NUMBER)
_ONES = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen "
        "eighteen nineteen".split()
    )
}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9}
_WORD_TOKEN = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)?")
# Clause boundaries: after a causal one only what follows counts; across an equivalence both sides are one quantity.
_CLAUSE = re.compile(
    r"(?P<causal>,?\s*\b(?:so|therefore|thus|hence)\b,?)"
    r"|(?P<equivalent>,?\s*\b(?:which is|which equals|which means|that is|i\.e\.|or)\b,?|\s*=\s*)",
    re.IGNORECASE,
)
# A number after one of these modifies the answer ("in 4 weeks", "for 5 days"); it is not the answer.
_MODIFIER_BEFORE = re.compile(r"\b(?:in|for|after|within|during|per|every|each)\s*\$?\Z", re.IGNORECASE)
_HALF = re.compile(r"\s+and\s+(?:a|one)\s+half\b", re.IGNORECASE)
_SCALE_AFTER = re.compile(r"\s*(?P<scale>thousand|million|billion)s?\b", re.IGNORECASE)
_DOZEN_AFTER = re.compile(r"\s*dozens?\b", re.IGNORECASE)
# (larger unit, smaller unit, smaller per larger): "N hours and M minutes".
_COMPOUNDS = tuple(
    (
        large,
        small,
        ratio,
        re.compile(rf"\s*(?:{large})s?\s*,?\s*(?:and\s+)?(?P<n>\d+(?:\.\d+)?)\s*(?:{small})(?:e?s)?\b", re.IGNORECASE),
    )
    for large, small, ratio in (
        ("hour", "minute", 60),
        ("minute", "second", 60),
        ("day", "hour", 24),
        ("week", "day", 7),
        ("year", "month", 12),
        ("foot|feet", "inch", 12),
        ("pound", "ounce", 16),
        ("dollar", "cent", 100),
    )
)
_UNITS = (
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "inch",
    "foot",
    "feet",
    "yard",
    "mile",
    "meter",
    "metre",
    "centimet",
    "kilomet",
    "cm",
    "km",
    "dollar",
    "cent",
    "pound",
    "ounce",
    "gram",
    "kilogram",
    "kg",
    "liter",
    "litre",
    "gallon",
    "cup",
    "dozen",
)
_UNIT_AFTER = re.compile(r"\s*([A-Za-z]+)")
# Arithmetic with a name in it ("10+John's age", "(x - 16) gallons"): an expression, not a number.
_VARIABLE = re.compile(
    r"[A-Za-z]\s*[+*×]\s*[\d(]|[\d)]\s*[+*×]\s*[A-Za-z]|[A-Za-z)]\s+[-\u2212]\s+[\d(]|[\d)]\s+[-\u2212]\s+[A-Za-z(]"
)
_CLOCK = re.compile(r"\b(\d{1,2}):(\d\d)\b")
_ADJECTIVE_AFTER = re.compile(r"-[A-Za-z]")  # "400-meter hurdles", "30-minute episodes"
_LATEX = re.compile(r"\\[a-zA-Z]|[{}^_]")
# Signs in words. "negative N" is always N's sign; "minus N" only where no operand precedes it ("5 minus 2" is
# arithmetic, and so is "x minus 5" or "his age minus 5", which name no number); "N (degrees) below zero" is -N.
_NEGATIVE_BEFORE = re.compile(r"\bnegative\s+\Z", re.IGNORECASE)
_UNARY_MINUS_BEFORE = re.compile(
    r"(?:\A|[:=(,]\s*|\b(?:is|was|are|were|be|equals?|to|at|of|gives?|gets?|makes?|reach(?:es|ed)?|becomes?|"
    r"remains?|by|from|about|around|approximately|answer)\s+)minus\s+\Z",
    re.IGNORECASE,
)
_MINUS_BEFORE = re.compile(r"\bminus\s+\Z", re.IGNORECASE)
_BELOW_ZERO_AFTER = re.compile(
    r"\s*(?:°\s*[CF]?|degrees?(?:\s+(?:celsius|fahrenheit|[CF]\b))?)?\s+below\s+(?:zero\b|0(?![\d.]))", re.IGNORECASE
)
# A number joined to another by an operator ("10 - 4 apples", "5 minus 2"): part of an expression, no answer itself.
_OPERATOR_BETWEEN = re.compile(
    r"\s*(?:[-\u2212+*\u00d7]|\b(?:minus|plus|times|divided\s+by|multiplied\s+by))\s*(?:negative\s+)?\$?",
    re.IGNORECASE,
)
_PROSE_WORD = re.compile(r"[A-Za-z]{2,}")


@dataclass(frozen=True)
class Reading:
    """What a prose answer says: a number in the grader's spelling, or None when it cannot be read ("unknown")."""

    value: str | None


@dataclass(frozen=True)
class _Mention:
    start: int
    end: int
    value: Fraction
    spelling: str  # as written, in the grader's spelling ("3/4" stays a fraction)
    percent: bool = False
    in_words: bool = False
    expression: bool = False  # an operand of arithmetic ("5 minus 2"), or a sign that cannot be read: never an answer


def canonical_number(text: str) -> str | None:
    """One spelling per number ("$1,250.00" -> "1250", ".5" -> "0.5", "−3" -> "-3"), so that equal answers compare
    equal as strings; None if `text` is not one number."""
    m = _NUMBER_FULL.fullmatch(text.strip())
    return None if m is None else _spell_match(m)


def _spell_match(m: re.Match[str]) -> str | None:
    if m["s1"] and m["s2"]:
        return None
    body = m["int"].replace(",", "")
    if body.startswith("."):
        body = "0" + body
    if "." in body:
        body = body.rstrip("0").rstrip(".")
    sign = "-" if m["s1"] or m["s2"] else ""
    return f"{sign}{body}{'/' + m['den'] if m['den'] else ''}{'%' if m['pct'] else ''}"


def spelled(value: Fraction) -> str:
    """A computed value in the grader's spelling: "84", "2.5", or "7/3" when its decimal does not end."""
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    digits = str(abs(int(value * 10**places))).rjust(places + 1, "0")
    body = f"{digits[:-places]}.{digits[-places:]}" if places else digits
    return f"{'-' if value < 0 else ''}{body}"


def _grammar(tokens: list[str]) -> list[int | None] | None:
    """Number words read one token at a time: after each token the value so far (None while incomplete, as
    after "a" or "and"), or None for the whole when the tokens stop being one number ("three four")."""
    total, current, last, values = 0, 0, "start", []
    for token in tokens:
        if token == "a" and last == "start":
            current, last = 1, "a"
        elif token == "and" and last in ("hundred", "scale"):
            last = "and"
        elif token in _ONES and 0 < _ONES[token] < 10 and last in ("start", "tens", "hundred", "scale", "and"):
            current, last = current + _ONES[token], "ones"
        elif (token in _TENS or token in _ONES) and last in ("start", "hundred", "scale", "and"):
            current, last = current + _TENS.get(token, _ONES.get(token, 0)), "tens" if token in _TENS else "teens"
        elif token == "hundred" and last in ("a", "ones", "teens"):
            current, last = current * 100, "hundred"
        elif token in _SCALES and token != "hundred" and last in ("a", "ones", "teens", "tens", "hundred"):
            total, current, last = total + current * _SCALES[token], 0, "scale"
        else:
            return None
        values.append(None if last in ("a", "and") else total + current)
    return values


def words_to_number(text: str) -> int | None:
    """ "twelve" -> 12, "two hundred and five" -> 205, "a million" -> 1000000; None if `text` is not one number in
    words."""
    values = _grammar(re.split(r"[\s-]+", text.lower().strip()))
    return values[-1] if values else None


def _word_numbers(text: str) -> list[tuple[int, int, int]]:
    """(start, end, value) of each longest run of number words ("two hundred and five", "twenty-five"); a lone "a"
    counts only before "dozen" ("a dozen": 1)."""
    tokens = [(m.start(), m.end(), part) for m in _WORD_TOKEN.finditer(text) for part in [m[0].lower()]]
    found, i = [], 0
    while i < len(tokens):
        best = None
        for j in range(i, len(tokens)):
            if j > i and text[tokens[j - 1][1] : tokens[j][0]].strip():
                break  # a comma or a digit ends a run
            values = _grammar([p for t in tokens[i : j + 1] for p in t[2].split("-")])
            if values is None:
                break
            if values[-1] is not None:
                best = (j, values[-1])
        if best is None and tokens[i][2] == "a" and i + 1 < len(tokens) and tokens[i + 1][2].startswith("dozen"):
            best = (i, 1)
        if best is None:
            i += 1
            continue
        found.append((tokens[i][0], tokens[best[0]][1], best[1]))
        i = best[0] + 1
    return found


def _mentions(text: str, words: bool | str) -> list[_Mention]:
    """Every number in `text` in order: in digits, and with `words` in words too (a lone "one", as often a
    pronoun, only with words="all")."""
    found = []
    for m in NUMBER_IN_TEXT.finditer(text):
        spelling = _spell_match(m)
        if spelling is None or (m["den"] and int(m["den"]) == 0):
            continue
        value = Fraction(m["int"].replace(",", "")) / (int(m["den"]) if m["den"] else 1)
        found.append(
            _Mention(m.start(), m.end(), -value if spelling.startswith("-") else value, spelling, bool(m["pct"]))
        )
    if words:
        found += [
            _Mention(a, b, Fraction(v), str(v), in_words=True)
            for a, b, v in _word_numbers(text)
            if not any(f.start < b and a < f.end for f in found) and (words == "all" or text[a:b].lower() != "one")
        ]
    return _signed(text, sorted(found, key=lambda f: f.start))


def _signed(text: str, found: list[_Mention]) -> list[_Mention]:
    """`found` with signs in words read ("negative 5", "minus 5", "5 below zero" are -5; a mention then spans its
    sign), and with the operands of arithmetic marked as such. A sign that cannot be read (a second sign, "minus"
    after a name) marks the mention too, so that it is unknown rather than read as +N."""
    signed: list[_Mention] = []
    for mention in found:
        before, start, end, value = text[: mention.start], mention.start, mention.end, mention.value
        arithmetic = bool(signed) and _OPERATOR_BETWEEN.fullmatch(text, signed[-1].end, mention.start) is not None
        signs = [m for m in (_NEGATIVE_BEFORE.search(before), _MINUS_BEFORE.search(before)) if m and not arithmetic]
        if below := _BELOW_ZERO_AFTER.match(text, end):
            signs.append(below)
            end = below.end()
        unreadable = (
            len(signs) > 1
            or (signs and value < 0)
            or any(m.re is _MINUS_BEFORE and not _UNARY_MINUS_BEFORE.search(before) for m in signs)
        )
        if signs:
            start, value = min(start, signs[0].start()), -value
        if arithmetic and signed:
            signed[-1] = replace(signed[-1], expression=True)
        spelling = f"-{mention.spelling}" if signs else mention.spelling
        signed.append(
            replace(mention, start=start, end=end, value=value, spelling=spelling, expression=arithmetic or unreadable)
        )
    return signed


def _ask(question: str) -> str:
    """The sentence of the question that asks (the last with "?", or with how/what/find), lower-cased."""
    sentences = [s for s in re.split(r"(?<=[.?!])\s+", question.strip()) if s]
    asking = [s for s in sentences if "?" in s or re.search(r"\b(?:how|what|find|calculate)\b", s, re.IGNORECASE)]
    return (asking or sentences or [""])[-1].lower()


def _asks(ask: str, unit: str) -> bool:
    return re.search(rf"\b(?:{unit})", ask) is not None


def _unit(text: str, end: int) -> str:
    """The unit word right after a number ("hours" -> "hour"), or "" when the next word is no unit."""
    m = _UNIT_AFTER.match(text, end)
    word = m[1].lower() if m else ""
    return next((u for u in _UNITS if word.startswith(u)), "")


def _qualified(text: str, mention: _Mention, ask: str | None) -> tuple[Reading, int, str]:
    """(the value of `mention` with what follows it, where that ends, its unit): "and a half", a scale word,
    "dozen", or "and M <smaller unit>"."""
    value, end, changed = mention.value, mention.end, False
    if half := _HALF.match(text, end):
        value, end, changed = value + (Fraction(1, 2) if value >= 0 else Fraction(-1, 2)), half.end(), True
    if scale := _SCALE_AFTER.match(text, end):
        word = scale["scale"].lower()
        if not (ask and re.search(rf"\b(?:in|how many)\s+{word}s?\b", ask)):
            value, changed = value * _SCALES[word], True
        end = scale.end()
    if dozen := _DOZEN_AFTER.match(text, end):
        if ask is None:
            return Reading(None), dozen.end(), "dozen"
        return Reading(spelled(value if "dozen" in ask else value * 12)), dozen.end(), "dozen"
    for large, small, ratio, compound in _COMPOUNDS:
        if m := compound.match(text, end):
            extra = Fraction(m["n"])
            if ask is not None and _asks(ask, small):
                return Reading(spelled(value * ratio + extra)), m.end(), small
            if ask is not None and _asks(ask, large):
                return Reading(spelled(value + extra / ratio)), m.end(), large.split("|")[0]
            return Reading(None), m.end(), ""
    spelling = spelled(value) + ("%" if mention.percent else "") if changed else mention.spelling
    return Reading(spelling), end, _unit(text, end)


def _pick(clause: str, mentions: list[_Mention], ends: list[int], marked: bool) -> int | None:
    """Which mention of a clause is its answer, or None when that is unclear. A number inside an earlier one's
    amount ("30" of "2 hours and 30 minutes") is not one of its own. A marked answer opens with its number (a
    sign or currency may come first) or holds only one. A last sentence ends with it: its last number, unless
    that one only modifies an earlier one ("84 eggs in 4 weeks", "$35 per hour for 3 hours"); numbers used as
    adjectives ("the 400-meter hurdles") are not candidates."""
    own = [i for i, m in enumerate(mentions) if not any(mentions[j].start < m.start < ends[j] for j in range(i))]
    if marked:
        if not clause[: mentions[own[0]].start].strip(" $:#-\u2212"):
            return own[0]
        return own[0] if len(own) == 1 else None
    own = [i for i in own if not _ADJECTIVE_AFTER.match(clause, mentions[i].end)] or own
    if len(own) > 1 and _MODIFIER_BEFORE.search(clause[: mentions[own[-1]].start].rstrip()):
        return None
    return own[-1]


def read_prose(text: str, question: str | None = None, marked: bool = True) -> Reading | None:
    """A prose answer read as the module doc says; None when `text` is not prose with a number in it (maths,
    LaTeX, a lone number, words only), for the caller to read as maths.

    `marked`: `text` follows an answer marker ("####", "The answer is"), so it opens with its number;
    otherwise it is a solution's last sentence, which ends with it, and whose number words alone are not read
    as an answer ("the first five tests"; a lone "one" is as often a pronoun)."""
    text = text.replace("\\$", "$").replace("\\%", "%").strip().lstrip("#:").strip().rstrip(".").strip()
    text = _CLOCK.sub(lambda m: m[1] if m[2] == "00" else m[0], text)  # "2:00 pm" is 2; "2:30 pm" stays unreadable
    if (
        _LATEX.search(text)
        or not _PROSE_WORD.search(NUMBER_IN_TEXT.sub(" ", text))
        or not _mentions(text, "all" if marked else True)
    ):
        return None
    if _VARIABLE.search(text) or _CLOCK.search(text):
        return Reading(None)
    ask = None if not question else _ask(question)
    bounds = list(_CLAUSE.finditer(text))
    starts, stops = [0, *(b.end() for b in bounds)], [*(b.start() for b in bounds), len(text)]
    kinds = [None, *("causal" if b["causal"] else "equivalent" for b in bounds)]
    readings: list[tuple[Reading, str]] = []  # the answer's clause, then the clauses equivalent to it, last first
    for start, stop, kind in reversed(list(zip(starts, stops, kinds))):
        clause = text[start:stop]
        mentions = _mentions(clause, words="all" if marked or readings else True)
        if not (
            marked or readings
        ):  # a last sentence: its numbers in words are counts in passing ("the first five tests")
            if mentions and all(m.in_words for m in mentions):
                return Reading(None)
            mentions = [m for m in mentions if not m.in_words]
        if mentions:
            qualified = [_qualified(clause, m, ask) for m in mentions]
            pick = _pick(clause, mentions, [q[1] for q in qualified], marked=marked or bool(readings))
            if pick is None or mentions[pick].expression:
                if not readings:
                    return Reading(None)
                break
            readings.append((qualified[pick][0], qualified[pick][2]))
        if readings and kind != "equivalent":
            break
    if not readings:
        return Reading(None)
    units = {u for _, u in readings if u}
    if len(units) > 1:  # "2 hours, which is 120 minutes": the question's unit decides
        matching = [r for r, u in readings if u and ask is not None and _asks(ask, u)]
        return matching[0] if len(matching) == 1 else Reading(None)
    return readings[0][0]
