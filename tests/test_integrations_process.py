"""Process-supervised GRPO: the advantage rule against hand-computed values, step ends on the policy's own
tokens under a real chat template, and ProcessGRPOTrainer training on CPU with the (B, T) advantages it built."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.integrations.advantages import process_advantages
from biprm.integrations.dense import decoded_offsets, step_end_chars, step_end_tokens
from biprm.integrations.grpo import AnswerReward, BiPRMReward

H = 0.5 / math.sqrt(2)  # outcome weight 0.5 times a two-member group's normalised outcome, 1/sqrt(2)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want.to(got.dtype), atol=1e-5, rtol=0)


def toy_group():
    """Two groups; rewards sit on step-end tokens; completion 3 has no scored step."""
    rewards, ends = torch.zeros(5, 6), torch.zeros(5, 6, dtype=torch.bool)
    for i, steps in enumerate([{1: 1.0, 3: 0.5}, {2: 0.0}, {0: 0.2, 5: 0.8}, {}, {2: 0.5}]):
        for t, r in steps.items():
            rewards[i, t], ends[i, t] = r, True
    mask = torch.arange(6)[None, :] < torch.tensor([6, 4, 6, 6, 5])[:, None]
    return rewards, ends, mask, ["a", "a", "b", "b", "b"]


def test_process_advantages_by_hand():
    rewards, ends, mask, group = toy_group()
    # group a: steps 1.0, 0.5, 0.0 -> mean 0.5, std 0.5 -> +1, 0, -1 (a step scoring exactly 0 still counts)
    # group b: steps 0.2, 0.8, 0.5 -> mean 0.5, std 0.3 -> -1, +1, 0; completion 3 is unscored
    want = torch.tensor(
        [[1, 1, 0, 0, 0, 0], [-1, -1, -1, 0, 0, 0], [0, 1, 1, 1, 1, 1], [0] * 6, [0] * 6], dtype=torch.float32
    )
    close(process_advantages(rewards, ends, mask, group), want)
    # outcome 1 / 0 in group a; in group b completion 3 (unscored) is left out of the statistics
    outcome = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    got = process_advantages(rewards, ends, mask, group, outcome, outcome_weight=0.5)
    want_outcome = torch.tensor([[H] * 6, [-H] * 4 + [0, 0], [H] * 6, [0] * 6, [-H] * 5 + [0]])
    close(got, want + want_outcome)
    outcome[0] = float("nan")  # no outcome for completion 0: its outcome term is 0, its group has one outcome left
    got = process_advantages(rewards, ends, mask, group, outcome, outcome_weight=0.5)
    close(got[:2], want[:2])
    # a group of one completion: its own steps 1.0, 0.5 -> mean 0.75, std 0.3536 -> +1/sqrt(2), -1/sqrt(2)
    one = process_advantages(rewards[:1], ends[:1], mask[:1], ["a"])
    close(one[0], torch.tensor([0, 0, -1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0]))


def test_step_rewards_that_barely_vary_keep_their_spread():
    """ProcessGRPOTrainer holds step rewards in float64: 0.5 and 0.5 + 4e-8 are one float32 spacing (6e-8) apart."""
    pytest.importorskip("trl")
    from biprm.integrations.process_grpo import ProcessGRPOTrainer

    trainer = SimpleNamespace(
        _steps=[([0], [0.5]), ([0], [0.5 + 4e-8])],
        num_generations=2,
        model=SimpleNamespace(training=True),
        _outcome_rewards=lambda: None,
        outcome_weight=1.0,
    )
    got = ProcessGRPOTrainer._token_advantages(trainer, torch.ones(2, 1, dtype=torch.bool))
    # mean 0.5 + 2e-8, deviations -+2e-8, unbiased std sqrt(2 * (2e-8)^2 / 1) = 2e-8 * sqrt(2); eps 1e-6
    want = 2e-8 / (2e-8 * math.sqrt(2) + 1e-6)
    assert got.dtype == torch.float32 and got[:, 0].tolist() == pytest.approx([-want, want], abs=1e-9)
    in_float32 = process_advantages(
        torch.tensor([[0.5], [0.5 + 4e-8]]), torch.ones(2, 1, dtype=torch.bool), torch.ones(2, 1), [0, 0]
    )
    assert abs(in_float32[1, 0].item() - want) > 1e-6  # rounded to 0.5 + 6e-8 first: 0.0286 where 0.0194 is right


def test_step_ends_on_the_policys_tokens_under_a_real_chat_template(tmp_path):
    from test_serve_rl import policies

    response = "Tom starts with 3 apples.\n\n3 + 4 = 7 × 1 ✓\n\nThe answer is 7."
    steps = ["Tom starts with 3 apples.", "3 + 4 = 7 × 1 ✓", "The answer is 7."]
    for folder in policies(tmp_path):
        tok = load_tokenizer(str(folder))
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "How many?"}], tokenize=False, add_generation_prompt=True
        )
        end = tok.convert_tokens_to_ids("<|im_end|>")
        ids = tok(response, add_special_tokens=False)["input_ids"] + [
            end,
            tok.eos_token_id,
        ]  # as the policy samples them
        assert "<|im_end|>" in tok.decode(tok(prompt, add_special_tokens=False)["input_ids"] + ids)
        text, offsets = decoded_offsets(tok, ids)
        assert text == response and len(offsets) == len(ids)
        placed = step_end_tokens(offsets, step_end_chars(text, steps))
        for step, token in zip(steps, placed):
            assert tok.decode(ids[: token + 1]).endswith(step) and not tok.decode(ids[:token]).endswith(step), folder
        assert placed[-1] == len(ids) - 3  # the last text token, before <|im_end|> and end-of-sequence


def test_answer_reward_grades_the_final_answer():
    got = AnswerReward(workers=0)(
        prompts=["q"] * 3,
        completions=[
            "2 + 2 = 4.\n\nThe answer is 4.",
            "The answer is 5.",
            [{"role": "assistant", "content": "So \\boxed{4}"}],
        ],
        answer=["4", "4", "4"],
    )
    assert got == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="no 'solution' column"):
        AnswerReward(column="solution", workers=0)(prompts=["q"], completions=["4"])


def tiny_policy(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
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


class FirstUnscorable(BiPRMReward):
    """A BiPRMReward whose first completion of every batch cannot be scored, as a too-long one could not."""

    def rows(self, prompts, completions):
        rows, why = super().rows(prompts, completions)
        return [None, *rows[1:]], [*why, "completion 0: longer than max_length"]


def length_reward(prompts, completions, **kwargs):
    """An outcome that varies from completion to completion."""
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize("outcome", [False, True])
def test_process_grpo_trains_two_steps_on_the_token_advantages(tmp_path, bi_scorer, caplog, outcome):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig

    from biprm.integrations.process_grpo import ProcessGRPOTrainer, placed_rewards

    tok = load_tokenizer(resolve_backbone("tiny"))
    policy = tiny_policy(tok)
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=16,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        generation_kwargs={"sequence_bias": {tuple(newline): 6.0}},
        per_device_eval_batch_size=8,
    )  # an evaluation batch larger than the generation batch TRL's logs keep
    made, used = [], []

    class Recorded(ProcessGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            made.append(
                {
                    "ids": out["completion_ids"],
                    "advantages": out["advantages"],
                    "mask": out["completion_mask"],
                    "steps": list(self._steps),
                    "outcome": self._outcome_rewards(),
                }
            )
            return out

        def _compute_loss(self, model, inputs):
            used.append((inputs["completion_ids"].clone(), inputs["advantages"].clone()))
            return super()._compute_loss(model, inputs)

    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = Recorded(
        model=policy,
        process_reward=FirstUnscorable(scorer=bi_scorer, split="newline"),
        reward_funcs=[length_reward] if outcome else None,
        outcome_weight=0.5,
        args=args,
        processing_class=tok,
        train_dataset=Dataset.from_dict({"prompt": [f"What is {i} + {i}?" for i in range(8)]}),
        eval_dataset=Dataset.from_dict({"prompt": [f"What is {i} - 1?" for i in range(8)]}),
    )
    with caplog.at_level(logging.WARNING, logger="biprm.integrations.process_grpo"):
        trainer.train()
    assert len(made) == len(used) == 2 and "could not be scored and get advantage 0" in caplog.text
    for m, (ids, adv) in zip(made, used):
        steps = m["steps"]
        assert adv.shape == ids.shape == m["mask"].shape  # the loss got (B, T) advantages, not TRL's (B,)
        assert m["advantages"][0].eq(0).all() and steps[0] == ([], [])  # the unscorable completion
        assert sum(len(ends) for ends, _ in steps) > len(steps)  # several steps per completion
        rewards, step_end = placed_rewards(steps, adv.shape[1])
        want = process_advantages(rewards, step_end, m["mask"], [0, 0, 1, 1], m["outcome"], 0.5).float()
        assert (
            torch.allclose(m["advantages"], want) and (want[:, :-1] != want[:, 1:]).any()
        )  # per token, varying along T
        by_ids = {tuple(row.tolist()): a for row, a in zip(m["ids"], want)}  # TRL shuffles the rows before the loss
        assert all(torch.allclose(a, by_ids[tuple(row.tolist())]) for row, a in zip(ids, adv))
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())
    assert "eval_loss" in trainer.evaluate() and len(trainer._logs["advantages"]) == 4
    logged = {k for e in trainer.state.log_history for k in e}
    assert {"process/unscorable_ratio", "process/truncated_ratio"} <= logged
    assert ("rewards/length_reward/mean" if outcome else "rewards/biprm/mean") in logged


def test_relog_puts_our_values_in_place_of_what_trl_just_logged():
    pytest.importorskip("trl")
    from collections import deque

    from biprm.integrations.process_grpo import relog

    logged = deque([0.0, 1.0], maxlen=4)
    logged.extend([2.0, 3.0])  # TRL's
    relog(logged, [20.0, 30.0])
    assert list(logged) == [0.0, 1.0, 20.0, 30.0]
    logged.extend([float(v) for v in range(8)])  # an evaluation batch larger than the log: it kept TRL's last 4
    relog(logged, [float(v) for v in range(10, 18)])
    assert list(logged) == [14.0, 15.0, 16.0, 17.0]
