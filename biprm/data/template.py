"""Prompt templates and step tags: the only place any of them is defined.

biprm's own layout is `render_prompt` + (`render_step` + STEP_TAG) per step. A PRM trained
elsewhere reads its own layout, so each PRM kind (see `biprm.prms`) names a `Template`
here: the text before the first step, each step's text up to and including its tag, and
whether its reference code tokenises the whole text at once (`joint`) or piece by piece.
Training, scoring and every evaluation encode through these, so a model always sees the
layout it was trained with, and the value head reads the hidden state at each step's tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

STEP_TAG = "<|step|>"


def render_prompt(question: str) -> str:
    """The part shared by both streams: it never depends on the steps or their order."""
    return f"Question: {question.strip()}\nStep-by-step solution:"


def render_step(step: str) -> str:
    """One step as it appears in either stream; the step-tag token id is appended after it."""
    return f"\n{step.strip()}"


@dataclass(frozen=True)
class Template:
    """One PRM kind's text layout. A step's text is `step(text, t)` followed by `tag`; the score is read at the tag's
    last token. `t` is the step's index in forward (L2R) order: some layouts put a joiner before every step but the
    first, and in the R2L stream a step keeps the joiner it has in L2R (the pieces are the same tokens, reordered).

    `joint`: the reference code tokenises prompt and steps as one text (offsets then cut it into pieces), else each
    piece on its own. `bos`: what comes before the prompt: "ids" (the BOS id, where the tokenizer has one),
    "tokenizer" (what the tokenizer puts first itself), "text" (the BOS text starts the prompt) or "none". `unique_tag`:
    the tag id occurs nowhere but after steps, so a count checks the layout and a step text holding the tag is
    refused. `splits`: the card's code cuts the whole solution on the tag, so a step holding the tag text is read as
    the card reads it, line by line, and scored after its last line (`Encoder`)."""

    kind: str
    prompt: Callable[[str], str]
    step: Callable[[str, int], str]
    tag: str
    joint: bool = False
    unique_tag: bool = True
    bos: str = "ids"
    close: str = ""  # the token a chat template ends the answer with, where a kind's score reads it (biprm.implicit)
    splits: bool = False
    specials: tuple[str, ...] = ()  # the special tokens the layout writes: a tokenizer that lacks one is not the kind's

    def render(self, question: str, steps: list[str]) -> tuple[str, list[str]]:
        """(prompt text, each step's text with its tag), in forward order."""
        return self.prompt(question), [self.step(s, t) + self.tag for t, s in enumerate(steps)]


QWEN_CHAT = ("<|im_start|>", "<|im_end|>")  # the special tokens of Qwen2.5's chat template
LLAMA3_CHAT = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")  # and of Llama 3's
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
LLAMA31_SYSTEM = (
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"  # Llama 3.1's default system turn, untrimmed
)


def _qwen_chat(question: str) -> str:
    """Qwen2.5's chat template up to the assistant's text, with the PRM card's system prompt."""
    return (
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


def _rlhflow_step(step: str, t: int) -> str:
    """Step t as a user turn (the first shares the question's), then the assistant header whose last token predicts
    "+" or "-"; every step but the first opens with the "+" the previous one was answered with. Every step is
    stripped, as RLHFlow's reference code strips each before building the turns (so a first step " x" follows the
    question after one space, not two)."""
    opening = "" if t == 0 else "+<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
    return f"{opening}{step.strip()}<|eot_id|><|start_header_id|>assistant<|end_header_id|>"


TEMPLATES = {
    "biprm": Template("biprm", render_prompt, lambda s, t: render_step(s), STEP_TAG),
    # Qwen2.5-Math-PRM: the chat template, steps joined only by <extra_0>, one after the last step too
    "qwen-prm": Template(
        "qwen-prm", _qwen_chat, lambda s, t: s, "<extra_0>", joint=True, bos="none", specials=(*QWEN_CHAT, "<extra_0>")
    ),
    # Skywork-o1-Open-PRM: no chat template; bos + problem + "\n", then each step's ids and the "\n" id; its
    # prepare_input cuts the response on "\n": a step holding one is tokenised line by line as it does, scored after
    # its last line
    "skywork-prm": Template(
        "skywork-prm", lambda q: q + "\n", lambda s, t: s, "\n", unique_tag=False, bos="text", splits=True
    ),
    # math-shepherd: f"{question} {output}" with output = "step ки\nstep ки"
    "math-shepherd": Template(
        "math-shepherd", lambda q: q, lambda s, t: (" " if t == 0 else "\n") + s, " ки", joint=True, bos="tokenizer"
    ),
    # RLHFlow: what RLHFlow/RLHF-Reward-Modeling's math-rm/prm_evaluate.py does with the model's own tokenizer: every
    # step stripped, the first user turn question + " " + step 1, each step a user turn answered "+", through the
    # chat template the checkpoint keeps from Llama-3.1-8B-Instruct (its axolotl config sets none of its own), which
    # writes the dated system turn even when the conversation has none and trims every turn. ProcessBench's
    # run_eval_prm_rlhflow.py goes through the same template (vLLM chat completions) but joins "\n\n", not " "
    "rlhflow": Template(
        "rlhflow",
        lambda q: (
            f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{LLAMA31_SYSTEM}<|eot_id|>"
            f"<|start_header_id|>user<|end_header_id|>\n\n{q.lstrip()} "
        ),
        _rlhflow_step,
        "\n\n",
        joint=True,
        unique_tag=False,
        bos="none",
        specials=LLAMA3_CHAT,
    ),
    # EurusPRM (implicit): the chat template, steps joined by "\n\n"; the <|im_end|> that closes the answer follows only
    # a stream's last step, so the model reads it there itself (biprm.implicit) rather than as part of a step
    "eurus-prm": Template(
        "eurus-prm",
        _qwen_chat,
        lambda s, t: s,
        "\n\n",
        joint=True,
        unique_tag=False,
        bos="none",
        close="<|im_end|>",
        specials=QWEN_CHAT,
    ),
    # TRL's PRMTrainer: bos + prompt ids + (step ids + separator ids) per step
    "token-classification": Template("token-classification", lambda q: q, lambda s, t: s, "\n", unique_tag=False),
}
