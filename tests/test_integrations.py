"""RL integrations: the GRPO reward equals the Scorer locally and over HTTP, per-token rewards land on step ends,
and TRL's GRPOTrainer trains with a BiPRM reward."""
import socket
import threading
import time

import numpy as np
import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.integrations.dense import step_end_chars, step_end_tokens, token_rewards
from biprm.integrations.grpo import BiPRMReward, message_text
from biprm.trajectory import Trajectory

PROMPTS = ["Tom has 3 apples and buys 4 more. How many?", "What is 2 + 2?"]
COMPLETIONS = ["3 + 4 = 7.\n\nThe answer is 7.", ""]


def test_step_ends_by_hand():
    text = "ab\n\ncde\n\nf"
    assert step_end_chars(text, ["ab", "cde", "f"]) == [2, 7, 10]
    offsets = [(0, 1), (1, 3), (3, 5), (5, 7), (7, 9), (9, 10)]  # token 1 holds "b\n", token 3 "de", token 5 "f"
    assert step_end_tokens(offsets, [2, 7, 10]) == [1, 3, 5]
    assert token_rewards(text, ["ab", "cde", "f"], [0.9, 0.5], offsets).tolist() == [0, 0.9, 0, 0.5, 0, 0]  # third step unscored
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
    trajs = [Trajectory(PROMPTS[0], ["3 + 4 = 7.", "The answer is 7."]), Trajectory(PROMPTS[1], ["(empty response)"])]
    assert got == bi_scorer.score(trajs, progress=False).solution_scores("mean").tolist()
    chat = reward(prompts=[[{"role": "system", "content": "be brief"}, {"role": "user", "content": p}] for p in PROMPTS],
                  completions=[[{"role": "assistant", "content": c}] for c in COMPLETIONS])
    assert chat == got
    with pytest.raises(ValueError, match="no 'user' message"):
        message_text([{"role": "system", "content": "x"}], "user")
    with pytest.raises(ValueError, match="exactly one of"):
        BiPRMReward()


def test_remote_reward_equals_local(bi_scorer):
    pytest.importorskip("fastapi")
    import uvicorn

    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(bi_scorer, ServeConfig(model="tiny")), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        remote = BiPRMReward(url=f"http://127.0.0.1:{port}/")(prompts=PROMPTS, completions=COMPLETIONS)
    finally:
        server.should_exit = True
        thread.join(10)
    assert remote == BiPRMReward(scorer=bi_scorer)(prompts=PROMPTS, completions=COMPLETIONS)


def test_grpo_trainer_runs_two_steps_with_a_biprm_reward(tmp_path, bi_scorer):
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tok = load_tokenizer(resolve_backbone("tiny"))
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id,
                                          eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id))
    reward = BiPRMReward(scorer=bi_scorer)
    seen = []

    def recorded(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        seen.append((len(completions), out))
        return out

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=12, learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", disable_tqdm=True)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = GRPOTrainer(model=policy, reward_funcs=[recorded], args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": [f"What is {i} + {i}?" for i in range(8)]}))
    trainer.train()
    assert len(seen) >= 2 and all(len(out) == n and all(0 < r < 1 for r in out) for n, out in seen)
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())
    assert any("rewards/recorded/mean" in e for e in trainer.state.log_history)
