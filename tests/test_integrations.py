"""RL integrations: the GRPO reward equals the Scorer locally and over HTTP, per-token rewards land on step ends,
and TRL's GRPOTrainer trains with a BiPRM reward."""

import threading
import urllib.error

import numpy as np
import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.trajectory import Trajectory
from biprm.integrations.dense import step_end_chars, step_end_tokens, token_rewards
from biprm.integrations.grpo import BiPRMReward, message_text
from conftest import scored, serving

PROMPTS = ["Tom has 3 apples and buys 4 more. How many?", "What is 2 + 2?"]
COMPLETIONS = ["3 + 4 = 7.\n\nThe answer is 7.", ""]


def test_step_ends_by_hand():
    text = "ab\n\ncde\n\nf"
    assert step_end_chars(text, ["ab", "cde", "f"]) == [2, 7, 10]
    offsets = [(0, 1), (1, 3), (3, 5), (5, 7), (7, 9), (9, 10)]  # token 1 holds "b\n", token 3 "de", token 5 "f"
    assert step_end_tokens(offsets, [2, 7, 10]) == [1, 3, 5]
    assert step_end_tokens([(0, 0), *offsets, (0, 0)], [2, 7, 10]) == [2, 4, 6]  # special tokens around the text
    assert token_rewards(text, ["ab", "cde", "f"], [0.9, 0.5], offsets).tolist() == [
        0,
        0.9,
        0,
        0.5,
        0,
        0,
    ]  # third step unscored
    with pytest.raises(ValueError, match="step 1"):
        step_end_chars(text, ["cde", "ab"])


def test_token_rewards_with_a_real_tokenizer(bi_scorer):
    text = "First we add.\n\nThen we stop."
    enc = bi_scorer.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    dense = token_rewards(text, ["First we add.", "Then we stop."], [0.25, 0.75], enc["offset_mapping"])
    placed = np.flatnonzero(dense)
    assert dense[placed].tolist() == [0.25, 0.75] and placed[-1] == len(enc["input_ids"]) - 1
    assert text[: enc["offset_mapping"][placed[0]][1]].endswith("add.")


def test_reward_is_the_scorers_solution_score_and_handles_conversations(bi_scorer):
    reward = BiPRMReward(scorer=bi_scorer, aggregation="mean")
    got = reward(prompts=PROMPTS, completions=COMPLETIONS, completion_ids=None, trainer_state=None)
    trajs = [Trajectory(PROMPTS[0], ["3 + 4 = 7.", "The answer is 7."])]
    assert got == [*scored(bi_scorer, trajs).solution_scores("mean").tolist(), 0.0]  # the empty one gets invalid_reward
    chat = reward(
        prompts=[[{"role": "system", "content": "be brief"}, {"role": "user", "content": p}] for p in PROMPTS],
        completions=[[{"role": "assistant", "content": c}] for c in COMPLETIONS],
    )
    assert chat == got
    with pytest.raises(ValueError, match="no 'user' message"):
        message_text([{"role": "system", "content": "x"}], "user")
    with pytest.raises(ValueError, match="exactly one of"):
        BiPRMReward()


def test_each_completion_is_encoded_once(bi_scorer, monkeypatch):
    from biprm.data.encoding import Encoder

    calls = []
    real = Encoder.encode
    monkeypatch.setattr(
        Encoder, "encode", lambda self, traj, where="trajectory": calls.append(where) or real(self, traj, where)
    )
    BiPRMReward(scorer=bi_scorer)(
        prompts=PROMPTS * 2, completions=["3 + 4 = 7.\n\nThe answer is 7.", "", "The answer is 8.", "7"]
    )
    assert calls == ["completion 0", "completion 2", "completion 3"]  # the empty completion never reaches the encoder


def test_remote_reward_equals_local_and_sends_the_api_key(bi_scorer, monkeypatch):
    pytest.importorskip("fastapi")
    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    with serving(build_app(bi_scorer, ServeConfig(model="tiny", api_key="k"))) as url:
        tag = bi_scorer.tokenizer.convert_ids_to_tokens(bi_scorer.model.config.step_tag_id)
        completions = [*COMPLETIONS, f"2 + 2 = 4 {tag}", "2 + 2 = 4.\n\nThe answer is 4."]
        prompts = [*PROMPTS, PROMPTS[1], PROMPTS[1]]
        remote = BiPRMReward(url=f"{url}/", request_size=2, invalid_reward=-1.0, api_key="k")(
            prompts=prompts, completions=completions
        )
        monkeypatch.setenv("BIPRM_API_KEY", "k")
        from_env = BiPRMReward(url=f"{url}/", request_size=2, invalid_reward=-1.0)(
            prompts=prompts, completions=completions
        )
        monkeypatch.delenv("BIPRM_API_KEY")
        with pytest.raises(urllib.error.HTTPError) as refused:
            BiPRMReward(url=f"{url}/")(prompts=prompts, completions=completions)
        remote_rows, why = BiPRMReward(url=f"{url}/", request_size=2, api_key="k").rows(prompts, completions)
    local = BiPRMReward(scorer=bi_scorer, invalid_reward=-1.0)(prompts=prompts, completions=completions)
    # equal up to float32 rounding (the server scores in other batches); the tagged one is refused, its neighbour scored
    assert remote == pytest.approx(local, abs=1e-6) and remote[1] == remote[2] == -1.0 and 0 < remote[3] < 1
    assert from_env == remote and refused.value.code == 401
    local_rows, _ = BiPRMReward(scorer=bi_scorer).rows(prompts, completions)  # the step scores ProcessGRPOTrainer reads
    assert [r is None for r in remote_rows] == [r is None for r in local_rows] == [False, True, True, False] and len(
        why
    ) == 2
    for got, want in zip(remote_rows, local_rows):
        if want is not None:
            assert got["steps"] == want["steps"] and got["fused"] == pytest.approx(want["fused"], abs=1e-6)


def test_remote_reward_retries_a_busy_server():
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers = [503, 503, 200]

    class Busy(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            code = answers.pop(0)
            body = json.dumps([{"solution": {"min": 0.25}}] if code == 200 else {"error": "busy"}).encode()
            self.send_response(code)
            self.send_header("Retry-After", "0.01")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = BiPRMReward(url=f"http://127.0.0.1:{server.server_port}")(
            prompts=PROMPTS[:1], completions=COMPLETIONS[:1]
        )
    finally:
        server.shutdown()
    assert got == [0.25] and answers == []


def test_grpo_trainer_runs_two_steps_with_a_biprm_reward(tmp_path, bi_scorer):
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tok = load_tokenizer(resolve_backbone("tiny"))
    torch.manual_seed(0)
    policy = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )
    )
    reward = BiPRMReward(scorer=bi_scorer)
    seen = []

    def recorded(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        seen.append((len(completions), out))
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=12,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[recorded],
        args=args,
        processing_class=tok,
        train_dataset=Dataset.from_dict({"prompt": [f"What is {i} + {i}?" for i in range(8)]}),
    )
    trainer.train()
    assert len(seen) >= 2 and all(len(out) == n and all(0 < r < 1 for r in out) for n, out in seen)
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())
    assert any("rewards/recorded/mean" in e for e in trainer.state.log_history)
