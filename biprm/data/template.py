"""The prompt template and the step tag: the only place either is defined.

Training, scoring and every evaluation encode through these two functions, so the
model always sees the same text layout. A step is followed by the step-tag token,
and the value head reads the hidden state at that token.
"""

STEP_TAG = "<|step|>"


def render_prompt(question: str) -> str:
    """The part shared by both streams: it never depends on the steps or their order."""
    return f"Question: {question.strip()}\nStep-by-step solution:"


def render_step(step: str) -> str:
    """One step as it appears in either stream; the step-tag token id is appended after it."""
    return f"\n{step.strip()}"
