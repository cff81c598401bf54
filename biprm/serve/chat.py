"""The user's question inside a chat-templated prompt, as RL trainers send prompts to /get_reward.

Trainers render each question with the policy's chat template (system message, turn
markup, the assistant's opening) before sampling, and send that text as the prompt. The
reward model was trained on the plain question, so the server takes it back out. The
template is rendered around marker messages once, which shows the text that opens a
user turn and the text that follows the user's message up to the assistant's answer;
a prompt's question is what lies between the last opener and that ending.
"""

from __future__ import annotations

import os

_ASK, _REPLY, _AGAIN = "BIPRMASK", "BIPRMREPLY", "BIPRMAGAIN"  # marker messages no template alters


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :]


class ChatPrompt:
    def __init__(self, tokenizer, name: str):
        def render(*texts: str) -> str:
            roles = ("user", "assistant")
            messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        before, self.ending = render(_ASK).split(_ASK)
        between = render(_ASK, _REPLY, _AGAIN).split(_REPLY)[1].split(_AGAIN)[0]
        self.opener = _common_suffix(before, between)  # the user turn's markup, with whatever closed the turn before it
        if not self.opener:
            raise ValueError(
                f"--chat-template {name}: cannot find the text that opens a user turn in its chat template"
            )
        self.name = name
        self.special = list(tokenizer.all_special_tokens)

    @classmethod
    def load(cls, name: str) -> "ChatPrompt":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(name))
        if not tokenizer.chat_template:
            raise ValueError(f"--chat-template {name}: this tokenizer has no chat template")
        return cls(tokenizer, name)

    def question(self, prompt: str) -> str | None:
        """The last user message of `prompt`, or None when the prompt is not this template's."""
        if not prompt.endswith(self.ending):
            return None
        head = prompt[: len(prompt) - len(self.ending)]
        start = head.rfind(self.opener)
        return None if start < 0 else head[start + len(self.opener) :].strip()
