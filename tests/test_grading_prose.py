"""Prose answers on raw completions, graded by hand: what a person reads, or "unknown" where a person needs more.

Each case is (question or None, raw completion, gold, the number a person reads (None: unknown), the person's verdict).
The completions are written in the styles of gsm8k_bon_small's policies (GPT-3.5's "Therefore, X will eat #### 7 dozen
eggs", MetaMath's "The answer is: ...") and, where marked, copied from that pool (question index in the comment).
The rule every case checks: the grader reads what the person reads, or says unknown; it never reads another number.
Where the number depends on the unit asked for ("7 dozen", "2 hours and 30 minutes", "2.5 hours, which is 150 minutes"),
a case without the question is unknown; "3 million" without the question is read as the number 3,000,000.
"""

from __future__ import annotations

import pytest

from biprm.evaluation import grading
from biprm.evaluation.grading import extract_answer, grade_solution, solution_verdict
from biprm.evaluation.prose import read_prose, spelled, words_to_number

CLAIRE_DOZENS = (
    "Claire makes a 3 egg omelet every morning for breakfast. How many dozens of eggs will she eat in 4 weeks?"
)
CLAIRE_EGGS = "Claire makes a 3 egg omelet every morning for breakfast. How many eggs will she eat in 4 weeks?"
MINUTES = "The movie has two parts. How many minutes long is the movie?"
HOURS = "The movie has two parts. How many hours long is the movie?"
MILLIONS = "A city spends money on roads. How much does it spend, in millions of dollars?"

CASES = [
    # 1. "#### N <unit> ... <another number>" in mid-line: the number after "####" (pool, question 18, GPT-3.5)
    (
        CLAIRE_DOZENS,
        "That is 84 eggs, or 84 / 12 = 7 dozen.\nTherefore, Claire will eat #### 7 dozen eggs in 4 weeks.",
        "7",
        "7",
        "correct",
    ),
    (
        CLAIRE_EGGS,
        "That is 84 eggs, or 84 / 12 = 7 dozen.\nTherefore, Claire will eat #### 7 dozen eggs in 4 weeks.",
        "84",
        "84",
        "correct",
    ),
    (
        None,
        "Therefore, Claire will eat #### 7 dozen eggs in 4 weeks.",
        "7",
        None,
        "unknown",
    ),  # 7 or 84: the question decides
    (CLAIRE_EGGS, "She eats a dozen eggs a week... so #### a dozen eggs.", "12", "12", "correct"),
    # 2. "N and a half"
    (None, "Each child gets 5 / 2 of a pie.\nThe answer is 2 and a half.", "2.5", "2.5", "correct"),
    (None, "She walks 3 and a half miles a day. #### 3 and a half miles", "3", "3.5", "wrong"),
    (None, "So the answer is two and a half hours.", "2.5", "2.5", "correct"),
    # 3. "N million"
    (None, "The total is 1.5 + 1.5 = 3.\nThe answer is 3 million dollars.", "3000000", "3000000", "correct"),
    (MILLIONS, "The total is 1.5 + 1.5 = 3.\nThe answer is 3 million dollars.", "3", "3", "correct"),
    (None, "#### -1.8 billion", "-1800000000", "-1800000000", "correct"),  # pool, question 507
    # 4. "N hours and M minutes": the question's unit decides
    (
        MINUTES,
        "Part one is 90 minutes and part two 60.\nThe answer is 2 hours and 30 minutes.",
        "150",
        "150",
        "correct",
    ),
    (HOURS, "Part one is 90 minutes and part two 60.\nThe answer is 2 hours and 30 minutes.", "2.5", "2.5", "correct"),
    (None, "The answer is 2 hours and 30 minutes.", "150", None, "unknown"),
    (MINUTES, "Together it takes 2 hours and 30 minutes.", "150", "150", "correct"),  # no marker: the last sentence
    (None, "Together it takes 2 hours and 30 minutes.", "30", None, "unknown"),  # never the 30 of "30 minutes"
    # 5. "X more than Y, so Z"
    (None, "Tom has 5 more than Sam, so 12.", "12", "12", "correct"),
    (None, "The answer is 5 more than Sam's 7, so 12 marbles.", "12", "12", "correct"),
    (None, "The answer is 5 more than Sam's 7, so 12 marbles.", "5", "12", "wrong"),
    # 6. "A, which is B" (the question asks for B)
    (MINUTES, "The answer is 2.5 hours, which is 150 minutes.", "150", "150", "correct"),
    (HOURS, "The answer is 2.5 hours, which is 150 minutes.", "2.5", "2.5", "correct"),
    (None, "The answer is 2.5 hours, which is 150 minutes.", "150", None, "unknown"),
    (None, "The answer is 12 + 8 = 20, which is 20 apples.", "20", "20", "correct"),
    # 7. number words
    (None, "The answer is twelve.", "12", "12", "correct"),
    (None, "#### twenty-five", "25", "25", "correct"),
    (None, "The answer is: two hundred and five", "205", "205", "correct"),
    (None, "So she has twelve apples left.", "12", None, "unknown"),  # an unmarked sentence in words alone is not read
    # 8. what a person cannot read as one number: unknown, never the nearest number
    (None, "The answer is Sophia bought 3 onions and 1 potato.", "4", None, "unknown"),  # pool, question 509
    (None, "The answer is (x - 16) gallons of water now.", "8", None, "unknown"),  # pool, question 214
    (None, "The answer is 10+John's age.", "50", None, "unknown"),  # pool, question 931
    (
        None,
        "She would lose $35 per hour for 3 fewer hours of freelance work.",
        "15",
        None,
        "unknown",
    ),  # pool, question 164: cut off
    (None, "The latest she can start is 2:30 pm.", "2.5", None, "unknown"),
    # the same readings as before, which must not change
    (
        None,
        "Therefore, Gerald can run the 400-meter hurdles, with his improved diet, in 32.4 seconds.",
        "36",
        "32.4",
        "wrong",
    ),  # pool, q. 93
    (
        None,
        "He has 150 - 50 = #### 100 dollars left. Each pen costs 25 dollars, so he can buy 100 / 25 = #### 4 pens.",
        "4",
        "4",
        "correct",
    ),
    (None, "The answer is 2:00 pm.", "2", "2", "correct"),
    (None, "Then Thomas has #### 240 5 dollar bills.", "240", "240", "correct"),
    (None, "She makes 9 * 2 = $18 every day at the farmer's market.", "18", "18", "correct"),
    (None, "Therefore, Sunny earned $540 for two days.", "540", "540", "correct"),  # pool, question 976
    (None, "#### 84 - 84 = 0", "0", "0", "correct"),
]


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(grading, "_CACHE", {})


@pytest.mark.parametrize("question,completion,gold,read,verdict", CASES)
def test_the_grader_reads_prose_as_a_person_does(question, completion, gold, read, verdict):
    assert extract_answer(completion, question) == read
    assert solution_verdict(gold, completion, question) == verdict
    assert grade_solution(gold, completion, question) is (verdict == "correct")


@pytest.mark.parametrize(
    "words,value",
    [
        ("twelve", 12),
        ("twenty-five", 25),
        ("two hundred and five", 205),
        ("a million", 10**6),
        ("one hundred twenty three thousand four hundred", 123400),
        ("three four", None),
        ("three and four", None),
        ("a", None),
        ("dozen", None),
    ],
)
def test_words_to_number(words, value):
    assert words_to_number(words) == value


def test_spelled_values_are_exact():
    from fractions import Fraction

    assert [spelled(Fraction(5, 2)), spelled(Fraction(-18, 10)), spelled(Fraction(13, 3)), spelled(Fraction(150))] == [
        "2.5",
        "-1.8",
        "13/3",
        "150",
    ]


def test_maths_and_words_without_numbers_are_not_prose():
    assert read_prose("9i + 6") is None  # maths: left to math-verify
    assert read_prose("\\frac{1}{2} cups") is None  # LaTeX
    assert read_prose("Evelyn") is None  # a word answer
    assert read_prose("12.5%") is None  # a lone number


SIGNS = [
    # (completion, gold, what a person reads (None: unknown))
    ("The answer is negative 5.", "-5", "-5"),
    ("The answer is minus 5.", "-5", "-5"),
    ("The answer is \u22125.", "-5", "-5"),
    ("The answer is -5.", "-5", "-5"),
    ("The answer is 5 below zero.", "-5", "-5"),
    ("At dawn it was 5 degrees below zero.", "-5", "-5"),
    ("So the temperature ends at negative 5.", "-5", "-5"),
    ("The answer is negative five.", "-5", "-5"),
    ("#### negative 12", "-12", "-12"),
    ("The answer is negative 2 and a half.", "-2.5", "-2.5"),
    # a sign word that belongs to something else
    ("5 minus 2 is 3. The answer is 3.", "3", "3"),
    ("Subtracting, 8 minus 3 leaves 5 apples.", "5", "5"),
    ("The answer is 10 minus 5.", "5", None),  # arithmetic, not a number
    ("The answer is 10 - 4 apples.", "6", None),
    ("The answer is his age minus 5.", "-5", None),  # "minus" after a name: not a sign
    ("The answer is negative -5.", "5", None),  # two signs
    ("The answer is -5 below zero.", "5", None),
]


@pytest.mark.parametrize("completion,gold,read", SIGNS)
def test_a_sign_in_words_is_read_or_the_answer_is_unknown(completion, gold, read):
    assert extract_answer(completion) == read
    assert solution_verdict(gold, completion) == ("unknown" if read is None else "correct")
    if read is not None and read.startswith("-"):
        assert not grade_solution(read[1:], completion)  # never +N
