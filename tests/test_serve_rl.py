"""/get_reward with the payload OpenRLHF 0.11 sends: `prompts` rendered with the policy's chat
template, `query` = decode(prompt ids + response ids, skip_special_tokens=False)."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from biprm.backbones import cache_root, load_tokenizer, resolve_backbone  # noqa: E402
from biprm.serve.app import build_app  # noqa: E402
from biprm.serve.chat import ChatPrompt  # noqa: E402
from biprm.serve.config import ServeConfig  # noqa: E402
from conftest import scored  # noqa: E402
from biprm.data.trajectory import Trajectory  # noqa: E402

Q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
RESPONSES = ["Tom starts with 3 apples.\n3 + 4 = 7.\nThe answer is 7.", "3 + 4 = 8.\nThe answer is 8."]
CHATML = (  # a ChatML template with a default system message, as SmolLM2's
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a careful tutor.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_policy(folder: Path) -> Path:
    """A policy tokenizer with a chat template and its own turn-markup tokens."""
    tok = load_tokenizer(resolve_backbone("tiny"))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(folder)
    return folder


def policies(tmp_path: Path) -> list[Path]:
    found = [tiny_policy(tmp_path / "policy")]
    smollm2 = (
        cache_root() / "smollm2-135m-instruct"
    )  # SmolLM2's real template, where `biprm` has built that backbone here
    return found + [smollm2] if (smollm2 / "tokenizer.json").is_file() else found


def openrlhf_payload(policy, question: str, responses: list[str]) -> dict:
    """What OpenRLHF 0.11's remote reward client sends for one prompt and its sampled responses."""
    prompt = policy.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = policy(prompt, add_special_tokens=False)["input_ids"]
    queries = []
    for response in responses:
        response_ids = policy(response, add_special_tokens=False)["input_ids"] + [
            policy.convert_tokens_to_ids(policy.eos_token)
        ]
        queries.append(policy.decode(prompt_ids + response_ids, skip_special_tokens=False))
    return {"query": queries, "prompts": [prompt] * len(responses)}


def test_the_question_is_found_inside_a_chat_templated_prompt(tmp_path):
    for folder in policies(tmp_path):
        tok = load_tokenizer(str(folder))
        chat = ChatPrompt(tok, str(folder))
        for messages in (
            [{"role": "user", "content": Q}],
            [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": Q}],
        ):
            prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert chat.question(prompt) == Q, (folder, prompt)
        assert chat.question(Q) is None  # not rendered with this template


def test_get_reward_scores_the_plain_question_of_an_openrlhf_payload(tmp_path, bi_scorer):
    for folder in policies(tmp_path):
        policy = load_tokenizer(str(folder))
        payload = openrlhf_payload(policy, Q, RESPONSES)
        assert payload["query"][0].startswith(payload["prompts"][0]) and payload["prompts"][0] != Q
        with TestClient(
            build_app(
                bi_scorer, ServeConfig(model="tiny", chat_template=str(folder), segmenter="newline", threshold=0.55)
            )
        ) as c:
            body = c.post("/get_reward", json=payload).json()
            wrong = c.post("/get_reward", json={"query": [Q + "x"], "prompts": [Q]})
        want = scored(bi_scorer, [Trajectory(Q, r.split("\n")) for r in RESPONSES])
        assert body["rewards"] == pytest.approx(want.solution_scores("min").tolist(), abs=1e-6), folder
        assert body["scores"] == body["rewards"]
        for got, i in zip(body["step_rewards"], (0, 1)):
            assert got == pytest.approx(want.of(i).tolist(), abs=1e-6)
        probs = [np.array(p) for p in body["step_rewards"]]
        first = [int(np.flatnonzero(p < 0.55)[0]) if (p < 0.55).any() else -1 for p in probs]
        assert body["extra_logs"] == {"first_step_below_threshold": first, "steps_scored": [3, 2]}
        assert (
            wrong.status_code == 400
            and "field 'prompts' [0] is not a prompt of the chat template" in wrong.json()["error"]
        )


def test_a_tokenizer_without_a_chat_template_is_refused_at_start():
    with pytest.raises(ValueError, match="has no chat template"):
        ChatPrompt.load(resolve_backbone("tiny"))
