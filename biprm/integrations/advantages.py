"""Process-supervised GRPO advantages (DeepSeekMath §4.1.3), one rule for the TRL trainer and verl's estimator.

Every step reward is normalised over all the steps of its group's completions,
r̃ = (r - mean) / (std + eps), and a token's advantage is the sum of r̃ over the steps
that end at or after it: a step's reward is credited to every token that led up to it.
An optional outcome reward per completion, normalised over its group as GRPO does, is
added to every token with a weight. A completion with no scored step gets advantage 0 and
counts in no statistic: the reward model said nothing about it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def group_stats(values: torch.Tensor, groups: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of `values` per group (std 0 for a group of one value, as nothing varies)."""
    count = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, groups, torch.ones_like(values))
    mean = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, groups, values) / count.clamp(min=1)
    square = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, groups, (values - mean[groups]) ** 2)
    return mean, (square / (count - 1).clamp(min=1)).sqrt()


def process_advantages(
    step_rewards: torch.Tensor,
    step_end: torch.Tensor,
    mask: torch.Tensor,
    group: Sequence,
    outcome: torch.Tensor | None = None,
    outcome_weight: float = 1.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(B, T) advantages from step rewards placed on the tokens where steps end.

    step_rewards: (B, T), read only where `step_end` (B, T, bool) is true, so a step may score 0.
    mask: (B, T) response tokens; the rest get 0. group: B ids (any hashable), the completions
    of one prompt share one. outcome: (B,) or None; NaN where a completion has no outcome.
    """
    rewards, mask = step_rewards.double(), mask.to(torch.float64)
    step_end = step_end.bool() & mask.bool()
    groups = torch.as_tensor(np.unique(np.asarray(group), return_inverse=True)[1].reshape(-1), dtype=torch.long)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    rows, cols = step_end.nonzero(as_tuple=True)
    mean, std = group_stats(rewards[rows, cols], groups[rows], n_groups)
    normed = torch.zeros_like(rewards)
    normed[rows, cols] = (rewards[rows, cols] - mean[groups[rows]]) / (std[groups[rows]] + eps)
    advantages = normed.flip(1).cumsum(1).flip(1)
    scored = step_end.any(dim=1)
    if outcome is not None:
        outcome = outcome.double()
        known = scored & ~outcome.isnan()
        mean, std = group_stats(outcome[known], groups[known], n_groups)
        advantages += outcome_weight * torch.where(known, (outcome - mean[groups]) / (std[groups] + eps), 0.0)[:, None]
    return (advantages * scored[:, None] * mask).to(step_rewards.dtype)
