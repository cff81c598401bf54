"""Training objectives (paper Section 4.1) as pure functions of per-step logits.

Steps of all trajectories in a batch are flat; `offsets` marks where each trajectory
starts. Each objective is a mean over a trajectory's terms, then a mean over
trajectories, as the paper writes L(tau). Everything runs in fp32 and in log space,
so logits of +-100 give finite losses and gradients in fp32 and bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from biprm.config import OBJECTIVES


def _step_index(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Trajectory id and in-trajectory position of every flat step."""
    lengths = offsets[1:] - offsets[:-1]
    traj = torch.repeat_interleave(torch.arange(len(lengths), device=offsets.device), lengths)
    return traj, torch.arange(len(traj), device=offsets.device) - offsets[traj]


def _trajectory_mean(per_step: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    traj, _ = _step_index(offsets)
    sums = torch.zeros(len(offsets) - 1, device=per_step.device).index_add(0, traj, per_step)
    return (sums / (offsets[1:] - offsets[:-1])).mean()


def bce_loss(logits: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """-1/T sum_t [y_t log r_t + (1-y_t) log(1-r_t)], with r_t = sigmoid(logit_t), on logits."""
    per_step = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    return _trajectory_mean(per_step, offsets)


def mse_loss(logits: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """1/T sum_t (sigmoid(logit_t) - y_t)^2."""
    per_step = (torch.sigmoid(logits.float()) - labels.float()) ** 2
    return _trajectory_mean(per_step, offsets)


def qrank_loss(logits: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor, zeta: float = 4.0) -> torch.Tensor:
    """PQM's Q-value ranking loss with margin zeta.

    For the correct steps c_1 < c_2 < ... and wrong steps W of a trajectory:
        Sigma_t = sum_{q=0..t} exp(r_{c_q}) + sum_{w in W} exp(r_w + zeta)
        L = -mean_t log(exp(r_{c_t}) / Sigma_t)
    c_0 is the virtual initial state with Q = 0, as in PQM's released loss; its own
    term (t = 0) joins the mean when the trajectory has a wrong step, so a trajectory
    with no correct step still pushes its wrong steps down. Labels >= 0.5 count as correct.
    """
    r = logits.float()
    correct = labels >= 0.5
    traj, pos = _step_index(offsets)
    B, T = len(offsets) - 1, int((offsets[1:] - offsets[:-1]).max())
    # A finite stand-in for -inf: exp() of it is exactly 0, and no gradient turns into NaN.
    absent = torch.full_like(r, _ABSENT)
    grid_correct = torch.full((B, T), _ABSENT, device=r.device).index_put((traj, pos), torch.where(correct, r, absent))
    grid_wrong = torch.full((B, T), _ABSENT, device=r.device).index_put(
        (traj, pos), torch.where(correct, absent, r + zeta)
    )
    cum_correct = torch.logcumsumexp(grid_correct, dim=1)[traj, pos]  # log sum_{q=1..t} exp(r_{c_q})
    lse_wrong = torch.logsumexp(grid_wrong, dim=1)  # log sum_w exp(r_w + zeta)
    log_sigma = torch.logsumexp(torch.stack([torch.zeros_like(r), cum_correct, lse_wrong[traj]]), dim=0)
    step_terms = torch.where(correct, log_sigma - r, torch.zeros_like(r))
    n_correct = torch.zeros(B, device=r.device).index_add(0, traj, correct.float())
    has_wrong = (n_correct < offsets[1:] - offsets[:-1]).float()
    virtual = has_wrong * F.softplus(lse_wrong)  # -log(exp(0) / (exp(0) + sum_w exp(r_w + zeta)))
    sums = torch.zeros(B, device=r.device).index_add(0, traj, step_terms) + virtual
    return (sums / (n_correct + has_wrong)).mean()


_ABSENT = -1.0e4


def objective_loss(
    name: str, logits: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor, zeta: float = 4.0
) -> torch.Tensor:
    if name == "bce":
        return bce_loss(logits, labels, offsets)
    if name == "mse":
        return mse_loss(logits, labels, offsets)
    if name == "qrank":
        return qrank_loss(logits, labels, offsets, zeta)
    raise ValueError(f"unknown objective {name!r}; choose one of {OBJECTIVES}")
