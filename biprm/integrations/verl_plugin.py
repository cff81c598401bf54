"""BiPRM in verl 0.9.1: the `biprm` reward manager and the `process_grpo` advantage estimator.

The manager's step rewards come from `biprm serve`. Importing this module registers both in
verl's registries; configs/verl-biprm.yaml shows the settings that make verl import it.

The manager scores a response's steps and its `assemble_rm_scores` puts each step's reward
on the response token where the step ends. `process_grpo` reads those token rewards back
(a nonzero token reward is a step end; BiPRM's step probabilities are never exactly 0)
and applies `biprm.integrations.advantages.process_advantages`.

verl 0.9.1 calls `assemble_rm_scores` only in `RewardLoopManager.compute_rm_score`, which
its PPO trainer runs when `reward.reward_model.enable` is true and the reward model shares
the actor's GPUs; there it reaches this manager's `run_single` only if
`reward.custom_reward_function.path` is set too (docs/RL.md). Otherwise the agent loop computes each reward during
rollout and places `reward_score`, one float, on the last token (`agent_loop.py`); step rewards cannot reach an
estimator on that path without a change to verl, and this manager's list-valued `reward_score` is refused there.
"""

from __future__ import annotations

import asyncio
import logging
import math

import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.trainer.ppo.core_algos import register_adv_est

from biprm.integrations.advantages import process_advantages
from biprm.integrations.dense import decoded_offsets, placed_step_rewards, stream_scores
from biprm.integrations.grpo import BiPRMReward, message_text

log = logging.getLogger(__name__)


@register_adv_est("process_grpo")
def compute_process_grpo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, config=None, epsilon: float = 1e-6, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: (advantages, returns), both (B, T); `index` holds each response's group uid."""
    if config is not None and config.get("use_kl_in_reward", False):
        raise ValueError(
            "algorithm.adv_estimator=process_grpo reads step rewards from the token rewards; "
            "algorithm.use_kl_in_reward adds a penalty to every token: use actor.use_kl_loss instead"
        )
    advantages = process_advantages(token_level_rewards, token_level_rewards != 0, response_mask, index, eps=epsilon)
    return advantages, advantages


@register("biprm")
class BiPRMRewardManager(RewardManagerBase):
    """Scores each response's steps through a running `biprm serve`.

    Settings come from `reward.reward_kwargs`: `url` (required), `split` (auto), `stream`
    (fused), `request_size` (64) and `batch_wait_s` (0.01: how long a request waits for the
    responses scored beside it, so that they go to the server together). A response that
    cannot be scored gets no step reward (advantage 0 under process_grpo) and a warning.
    """

    def __init__(self, config, tokenizer, compute_score=None, **kwargs):
        super().__init__(config, tokenizer, compute_score)
        opts = dict(config.reward.get("reward_kwargs") or {})
        if "url" not in opts:
            raise ValueError("reward.reward_kwargs.url: the address of a running `biprm serve` is required")
        self.reward = BiPRMReward(
            url=opts["url"], split=opts.get("split", "auto"), request_size=int(opts.get("request_size", 64))
        )
        self.stream, self.batch_wait = opts.get("stream", "fused"), float(opts.get("batch_wait_s", 0.01))
        self._pending: list[tuple[str, str, asyncio.Future]] = []

    async def run_single(self, data: DataProto) -> dict:
        """reward_score: [[token, reward], ...] for the steps of the last response in `data`."""
        item = data[-1]
        length = int(item.batch["attention_mask"][-item.batch["responses"].shape[-1] :].sum())
        text, offsets = decoded_offsets(self.tokenizer, item.batch["responses"][:length].tolist())
        row = await self._score(message_text(list(item.non_tensor_batch["raw_prompt"]), "user"), text)
        placed = ([], []) if row is None else self._place(text, row, offsets)
        info = {
            "biprm_solution": math.nan if row is None else row["solution"][self.reward.aggregation],
            "biprm_steps": len(placed[0]),
        }
        return {"reward_score": [list(p) for p in zip(*placed)], "reward_extra_info": info}

    def _place(self, text: str, row: dict, offsets: list[tuple[int, int]]) -> tuple[list[int], list[float]]:
        try:
            return placed_step_rewards(text, row["steps"], stream_scores(row, self.stream), offsets)
        except ValueError as error:  # a step not found in the text
            log.warning("a response could not be scored and gets no step reward: %s", error)
            return [], []

    async def _score(self, question: str, text: str) -> dict | None:
        """The score row of one response, sent to the server with the others waiting in this worker."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((question, text, future))
        if len(self._pending) == 1:
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(self.batch_wait)
        batch, self._pending = self._pending, []
        try:
            rows, why = await asyncio.get_running_loop().run_in_executor(
                None, self.reward.rows, [q for q, _, _ in batch], [t for _, t, _ in batch]
            )
        except Exception as error:  # noqa: BLE001  every waiting response hears of it
            for *_, future in batch:
                future.set_exception(error)
            return
        if why:
            log.warning(
                "%d of %d responses could not be scored and get no step reward; first: %s", len(why), len(batch), why[0]
            )
        for (*_, future), row in zip(batch, rows):
            future.set_result(row)

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list[list[list[float]]]) -> torch.Tensor:
        """rm_scores (B, response length): each step's reward on the token where the step ends, 0 elsewhere."""
        rm_scores = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        for i, steps in enumerate(scores):
            for token, reward in steps:
                rm_scores[i, int(token)] = reward
        return rm_scores
