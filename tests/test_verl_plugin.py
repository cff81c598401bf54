"""verl 0.9.1: the `biprm` reward manager and the `process_grpo` estimator, found through verl's registries,
on real DataProto batches scored by a running `biprm serve`. verl pins transformers<5.11, so these run in a
venv of their own (.ci/run); elsewhere they skip."""

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl")
pytest.importorskip("fastapi")
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from biprm.backbones import load_tokenizer, resolve_backbone  # noqa: E402
from biprm.data.trajectory import Trajectory  # noqa: E402
from biprm.integrations import verl_plugin  # noqa: E402
from conftest import scored, serving  # noqa: E402
from test_integrations_process import close, toy_group  # noqa: E402

QUESTIONS = ["What is 3 + 4?", "What is 2 + 2?"]
RESPONSES = [
    ["3 + 4 = 7.\n\nThe answer is 7.", "3 + 4 = 8.\n\nSo 8.\n\nThe answer is 8."],
    ["2 + 2 = 4.\n\nThe answer is 4.", ""],
]  # the empty response cannot be scored


def hand_advantages(rewards: np.ndarray, groups: list[int]) -> np.ndarray:
    """DeepSeekMath's rule written out plainly: z-score the steps over the group, then sum from the right."""
    out = np.zeros_like(rewards)
    for g in set(groups):
        rows = [i for i in range(len(groups)) if groups[i] == g]
        values = np.concatenate([rewards[i][rewards[i] != 0] for i in rows])
        mean, std = values.mean(), values.std(ddof=1) if len(values) > 1 else 0.0
        for i in rows:
            z = np.where(rewards[i] != 0, (rewards[i] - mean) / (std + 1e-6), 0.0)
            out[i] = np.cumsum(z[::-1])[::-1] * (rewards[i] != 0).any()
    return out


def batch(tok) -> DataProto:
    """Left-padded prompts, right-padded responses (each ends with end-of-sequence), as verl's rollout gives them."""
    prompts, responses, uids, raw = [], [], [], []
    for g, (question, answers) in enumerate(zip(QUESTIONS, RESPONSES)):
        for answer in answers:
            prompts.append(tok(question, add_special_tokens=False)["input_ids"])
            responses.append(tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
            uids.append(f"q{g}")
            raw.append([{"role": "user", "content": question}])
    P, R = max(map(len, prompts)), max(map(len, responses))
    pad = tok.pad_token_id
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (R - len(r)) for r in responses])
    attention = torch.tensor(
        [[0] * (P - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (R - len(r)) for p, r in zip(prompts, responses)]
    )
    raw_prompt = np.empty(len(raw), dtype=object)
    raw_prompt[:] = raw
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": torch.cat([prompt_ids, response_ids], 1),
        "attention_mask": attention,
        "response_mask": attention[:, P:],
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=len(prompts)),
        non_tensor_batch={"uid": np.array(uids, dtype=object), "raw_prompt": raw_prompt},
    )


def test_both_pieces_are_found_through_verls_registries():
    assert get_reward_manager_cls("biprm") is verl_plugin.BiPRMRewardManager
    assert get_adv_estimator_fn("process_grpo") is verl_plugin.compute_process_grpo_advantage


def test_process_grpo_through_compute_advantage_equals_the_hand_computed_toy():
    rewards, ends, mask, group = toy_group()
    rewards[1, 2] = 1e-3  # verl reads step ends from nonzero token rewards: the toy's exact 0 becomes a small one
    data = DataProto(
        batch=TensorDict({"token_level_rewards": rewards * ends, "response_mask": mask.long()}, batch_size=5),
        non_tensor_batch={"uid": np.array(group, dtype=object)},
    )
    got = compute_advantage(data, "process_grpo", config=AlgoConfig(adv_estimator="process_grpo")).batch["advantages"]
    close(got, torch.tensor(hand_advantages((rewards * ends).numpy(), [0, 0, 1, 1, 1]), dtype=torch.float32))
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        compute_advantage(data, "process_grpo", config=AlgoConfig(adv_estimator="process_grpo", use_kl_in_reward=True))


@pytest.fixture(scope="module")
def scorer():
    """An untrained tiny `l2r` model: under transformers 5.10 (verl's pin) building a `bi` model fails in
    BiPRMModel._init_weights (it is handed the gate's ReLU), so this venv serves a one-stream model."""
    from biprm.modeling import from_backbone
    from biprm.scoring import Scorer

    tok = load_tokenizer(resolve_backbone("tiny"))
    torch.manual_seed(0)
    return Scorer(from_backbone(resolve_backbone("tiny"), tok, mode="l2r").eval(), tok)


def test_reward_manager_scores_a_real_batch_through_biprm_serve(scorer):
    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    tok = load_tokenizer(resolve_backbone("tiny"))
    data = batch(tok)
    posts = []
    with serving(build_app(scorer, ServeConfig(model="tiny"))) as url:
        config = OmegaConf.create({"reward": {"reward_kwargs": {"url": url, "split": "double-newline"}}})
        manager = verl_plugin.BiPRMRewardManager(config, tok)
        post = manager.reward._post
        manager.reward._post = lambda trajs: posts.append(len(trajs)) or post(trajs)

        async def score_all():
            return await asyncio.gather(*[manager.run_single(data[i : i + 1]) for i in range(len(data))])

        outputs = asyncio.run(score_all())
    assert posts == [3]  # one request for the three scorable responses of the batch
    rm_scores = verl_plugin.BiPRMRewardManager.assemble_rm_scores(data, [o["reward_score"] for o in outputs])
    extra = {k: np.array([o["reward_extra_info"][k] for o in outputs]) for k in ("biprm_solution", "biprm_steps")}
    check_rewards_and_advantages(scorer, tok, data, rm_scores, extra)


def check_rewards_and_advantages(scorer, tok, data: DataProto, rm_scores: torch.Tensor, extra: dict) -> None:
    """rm_scores hold each scorable response's step scores where its steps end, the unscorable one none; verl's
    compute_advantage turns them into process_grpo's advantages, as computed by hand."""
    want = scored(
        scorer,
        [
            Trajectory(QUESTIONS[0], RESPONSES[0][0].split("\n\n")),
            Trajectory(QUESTIONS[0], RESPONSES[0][1].split("\n\n")),
            Trajectory(QUESTIONS[1], RESPONSES[1][0].split("\n\n")),
        ],
    )
    for i in range(3):
        placed = rm_scores[i].nonzero().flatten()
        assert rm_scores[i, placed].tolist() == pytest.approx(want.of(i).tolist(), abs=1e-6)
        assert tok.decode(data.batch["responses"][i, : placed[-1] + 1]).endswith(RESPONSES[i // 2][i % 2][-15:])
    assert rm_scores[3].eq(0).all() and math.isnan(extra["biprm_solution"][3])
    assert extra["biprm_steps"].tolist() == [2, 3, 2, 0]
    data.batch["token_level_rewards"] = rm_scores
    advantages = compute_advantage(data, "process_grpo", config=AlgoConfig(adv_estimator="process_grpo")).batch[
        "advantages"
    ]
    close(advantages, torch.tensor(hand_advantages(rm_scores.double().numpy(), [0, 0, 1, 1]), dtype=torch.float32))
    assert advantages[3].eq(0).all() and advantages[:3].abs().sum() > 0


def shipped_config():
    """verl's default PPO config with configs/verl-biprm.yaml merged in, as a run with its keys as overrides reads
    it."""
    default = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    return OmegaConf.merge(default, OmegaConf.load(Path(__file__).parents[1] / "configs/verl-biprm.yaml"))


def test_the_shipped_config_resolves_both_pieces_in_verls_default_config():
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    config = shipped_config()
    assert resolve_reward_manager_cls(config) is verl_plugin.BiPRMRewardManager
    assert get_adv_estimator_fn(config.algorithm.adv_estimator) is verl_plugin.compute_process_grpo_advantage
    manager = verl_plugin.BiPRMRewardManager(config, load_tokenizer(resolve_backbone("tiny")))
    assert (manager.reward.url, manager.reward.split, manager.stream) == ("http://127.0.0.1:8000", "auto", "fused")


def test_verls_reward_loop_scores_a_batch_on_ray_for_compute_advantage(scorer):
    """The largest part of a verl 0.9.1 PPO step that runs on a CPU (docs/RL.md says where the rest stops): verl's own
    RewardLoopManager starts a RewardLoopWorker in a local Ray, which loads the biprm manager from the shipped config
    and scores each response through biprm serve; the manager assembles rm_scores, and compute_advantage follows."""
    ray = pytest.importorskip("ray")
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    tok = load_tokenizer(resolve_backbone("tiny"))
    data = batch(tok)
    config = shipped_config()
    config.reward.num_workers = 1
    config.actor_rollout_ref.model.path = resolve_backbone("tiny")  # the worker reads the policy's tokenizer from here
    with serving(build_app(scorer, ServeConfig(model="tiny"))) as url:
        config.reward.reward_kwargs.url, config.reward.reward_kwargs.split = url, "double-newline"
        ray.init(num_cpus=1, include_dashboard=False)
        try:
            out = RewardLoopManager(config).compute_rm_score(data)
        finally:
            ray.shutdown()
    check_rewards_and_advantages(scorer, tok, data, out.batch["rm_scores"], out.non_tensor_batch)
