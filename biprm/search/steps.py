"""The one splitter between a policy's text and a PRM's steps.

The policy writes steps separated by the search's step token (kept in the text it
generates, so a continued prefix reads as the policy wrote it); the PRM reads the
same text cut at that token, with the token itself stripped. Generation and scoring
both go through these two functions, so they can never cut a solution differently; the cut
itself is biprm.data.segment's, the one splitter of biprm.
"""

from __future__ import annotations

from biprm.data.segment import separator

STEP_TOKEN = "\n\n"


def split_steps(text: str, step_token: str = STEP_TOKEN) -> list[str]:
    """Steps of a (partial) solution; pieces that hold only whitespace are not steps."""
    return [step.text for step in separator(step_token)(text)]


def join_steps(steps: list[str], step_token: str = STEP_TOKEN) -> str:
    """The text of a partial solution as the policy continues it: every step closed by the token."""
    return "".join(step + step_token for step in steps)


def response_steps(response: str, step_token: str, where: str) -> list[str]:
    """A search library's response text cut into steps at its step token; one with no step text is an error naming
    it."""
    steps = split_steps(response, step_token)
    if not steps:
        raise ValueError(f"{where}: no step text after splitting at the step token {step_token!r}")
    return steps
