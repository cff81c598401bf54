"""GRPO with step-level credit: TRL's GRPOTrainer with (B, T) advantages built from a BiPRM's step scores.

    from biprm.integrations.grpo import AnswerReward, BiPRMReward
    from biprm.integrations.process_grpo import ProcessGRPOTrainer
    trainer = ProcessGRPOTrainer(model=policy, process_reward=BiPRMReward(url="http://rm-host:8000"),
                                 reward_funcs=[AnswerReward()], outcome_weight=1.0, args=GRPOConfig(...), ...)

The policy's own tokens are decoded, cut into steps by the reward's splitter and scored;
each step's score is placed on the token where its text ends (`integrations/dense.py`),
and `process_advantages` turns them into one advantage per token, which TRL's loss takes
as they are. `reward_funcs`, when given, are the outcome term: their sum under
`args.reward_weights`, times `outcome_weight`. Without them TRL logs the BiPRM's solution
score as its reward (`rewards/biprm/mean` and `/std`) and the advantages are the steps' alone.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from biprm.integrations.advantages import process_advantages
from biprm.integrations.dense import decoded_offsets, placed_step_rewards, stream_scores
from biprm.integrations.grpo import BiPRMReward

log = logging.getLogger(__name__)

Steps = tuple[list[int], list[float]]  # (token where each scored step ends, its reward); empty when unscorable


def relog(logged: deque, values: list[float]) -> None:
    """`values` in place of the as many entries just appended to a TRL log. The log is bounded (the generation batch),
    so after a larger batch, as an evaluation's can be, it holds only the last of them."""
    for _ in range(min(len(values), len(logged))):
        logged.pop()
    logged.extend(values)


def placed_rewards(steps: list[tuple[list[int], list[float]]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, width) step rewards, each on the token where its step ends, and (N, width) where steps end, from each
    completion's (ends, values). float64: in float32, scores 1e-8 apart round to one value and their spread is lost."""
    rewards, step_end = (
        torch.zeros(len(steps), width, dtype=torch.float64),
        torch.zeros(len(steps), width, dtype=torch.bool),
    )
    for i, (ends, values) in enumerate(steps):
        rewards[i, ends], step_end[i, ends] = torch.tensor(values, dtype=torch.float64), True
    return rewards, step_end


class ProcessGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are DeepSeekMath's process supervision (see `biprm.integrations.advantages`).

    stream: the step output that is the reward ("fused", or one stream, "l2r" or "r2l").
    A completion that cannot be scored gets advantage 0 and a warning. A truncated one (no
    end-of-sequence token) is scored as written and marked in the completions table and in
    `process/truncated_ratio`; `GRPOConfig(mask_truncated_completions=True)` drops it from the loss.
    """

    def __init__(
        self,
        model: Any,
        process_reward: BiPRMReward,
        reward_funcs: list | None = None,
        *,
        stream: str = "fused",
        outcome_weight: float = 1.0,
        **kwargs,
    ):
        if stream not in ("fused", "l2r", "r2l"):
            raise ValueError(f"stream {stream!r}: choose 'fused', 'l2r' or 'r2l'")
        if any(kwargs.get(k) for k in ("tools", "rollout_func", "environment_factory")):
            raise ValueError(
                "ProcessGRPOTrainer scores single-turn completions; tools, rollout_func and environment_factory are "
                "not supported"
            )
        self.process_reward, self.stream, self.outcome_weight = process_reward, stream, outcome_weight
        self.has_outcome = bool(reward_funcs)
        self._rows: list[dict | None] = []
        super().__init__(model, reward_funcs=reward_funcs or [self.biprm], **kwargs)

    def biprm(self, prompts: list, completions: list, **kwargs) -> list[float | None]:
        """TRL's reward when no outcome reward is given: each completion's solution score, from this batch's
        scoring; None (unscorable) keeps a completion out of TRL's reward statistics."""
        return [None if row is None else row["solution"][self.process_reward.aggregation] for row in self._rows]

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rows, self._steps = self._score_steps(prompts, completion_ids_list)
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _score_steps(
        self, prompts: list, completion_ids_list: list[list[int]]
    ) -> tuple[list[dict | None], list[Steps]]:
        """Score rows of this process's completions and their step rewards on the policy's tokens."""
        decoded = [decoded_offsets(self._tokenizer, ids) for ids in completion_ids_list]
        rows, why = self.process_reward.rows(prompts, [text for text, _ in decoded])
        steps = []
        for i, ((text, offsets), row) in enumerate(zip(decoded, rows)):
            try:
                steps.append(
                    ([], [])
                    if row is None
                    else placed_step_rewards(text, row["steps"], stream_scores(row, self.stream), offsets)
                )
            except ValueError as error:  # a step not found in the text
                rows[i] = None
                steps.append(([], []))
                why.append(f"completion {i}: {error}")
        if why:
            log.warning(
                "%d of %d completions could not be scored and get advantage 0; first: %s", len(why), len(rows), why[0]
            )
        eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        truncated = [bool(ids) and ids[-1] not in eos_and_pad for ids in completion_ids_list]
        self._log_completion_extra("step_rewards", [[round(r, 4) for r in s] for _, s in steps])
        self._log_completion_extra("truncated", truncated)
        self._log_metric("process/truncated_ratio", sum(truncated) / max(1, len(truncated)))
        self._log_metric("process/unscorable_ratio", sum(row is None for row in rows) / max(1, len(rows)))
        return rows, steps

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        mask = output["completion_mask"]
        advantages = self._token_advantages(mask)
        start = self.accelerator.process_index * len(mask)
        output["advantages"] = advantages[start : start + len(mask), : mask.size(1)].to(mask.device)
        relog(
            self._logs["advantages"], advantages[:, 0].tolist()
        )  # each completion's first-token advantage, not TRL's (B,)
        return output

    def _token_advantages(self, completion_mask: torch.Tensor) -> torch.Tensor:
        """(N, T') advantages of every process's completions (this process's T' >= T), as the groups span processes."""
        steps = gather_object(self._steps)
        width = max([completion_mask.size(1), *(e + 1 for ends, _ in steps for e in ends)])
        rewards, step_end = placed_rewards(steps, width)
        lengths = torch.tensor(gather_object([int(m.sum()) for m in completion_mask]))
        mask = torch.arange(width)[None, :] < lengths[:, None]
        n_gen = self.num_generations if self.model.training else self.num_generations_eval
        group = torch.arange(len(steps)) // n_gen
        return process_advantages(
            rewards, step_end, mask, group, self._outcome_rewards(), self.outcome_weight
        ).float()  # TRL's dtype

    def _outcome_rewards(self) -> torch.Tensor | None:
        """Every process's outcome reward (the reward functions' weighted sum; NaN where all gave None), or None."""
        if not self.has_outcome:
            return None
        per_func = self._rewards_per_func.cpu()
        outcome = (per_func * self.reward_weights[None, :]).nansum(dim=1)
        return outcome.masked_fill(per_func.isnan().all(dim=1), float("nan"))
