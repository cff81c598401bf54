"""Objectives against values computed by hand (see the comments for the arithmetic)."""

import math

import pytest
import torch

from biprm.losses import bce_loss, mse_loss, objective_loss, qrank_loss

# two trajectories: [2.0, -1.0] with labels [1, 0]; [0.0] with label [1]
LOGITS = torch.tensor([2.0, -1.0, 0.0])
LABELS = torch.tensor([1.0, 0.0, 1.0])
OFFSETS = torch.tensor([0, 2, 3])


def sig(x):
    return 1 / (1 + math.exp(-x))


def test_bce_by_hand():
    # traj 1: (-log sig(2) - log(1 - sig(-1))) / 2 = (0.126928 + 0.313262) / 2 = 0.220095
    # traj 2: -log sig(0) = log 2 = 0.693147 ; batch mean = 0.456621
    t1 = (-math.log(sig(2.0)) - math.log(1 - sig(-1.0))) / 2
    expected = (t1 + math.log(2)) / 2
    assert bce_loss(LOGITS, LABELS, OFFSETS).item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.456621, abs=1e-6)


def test_mse_by_hand():
    # traj 1: ((sig(2) - 1)^2 + sig(-1)^2) / 2 = (0.014209 + 0.072329) / 2 = 0.043269 ; traj 2: 0.25
    # batch mean = (0.043269 + 0.25) / 2 = 0.146635
    t1 = ((sig(2.0) - 1) ** 2 + sig(-1.0) ** 2) / 2
    expected = (t1 + 0.25) / 2
    assert mse_loss(LOGITS, LABELS, OFFSETS).item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.146635, abs=1e-5)


def test_qrank_by_hand():
    # traj 1: correct c_1 = step 0 (r = 2), wrong W = {step 1} (r = -1), zeta = 4
    #   Sigma_1 = e^0 + e^2 + e^(-1+4) = 1 + 7.389056 + 20.085537 = 28.474593
    #   term_1  = -log(e^2 / Sigma_1) = log(28.474593) - 2 = 1.349012
    #   term_0 (virtual c_0, present because W is not empty) = log(1 + e^3) = 3.048587
    #   L = (1.349012 + 3.048587) / 2 = 2.198800
    # traj 2: one correct step r = 0, no wrong step: Sigma_1 = e^0 + e^0 = 2, L = log 2
    t1 = ((math.log(1 + math.e**2 + math.e**3) - 2) + math.log(1 + math.e**3)) / 2
    expected = (t1 + math.log(2)) / 2
    assert qrank_loss(LOGITS, LABELS, OFFSETS, zeta=4.0).item() == pytest.approx(expected, abs=1e-5)
    assert t1 == pytest.approx(2.198800, abs=1e-5)


def test_qrank_orders_correct_steps_and_margin():
    # cumulative sums: the second correct step's Sigma includes the first
    logits, labels, offsets = torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0]), torch.tensor([0, 2])
    t1 = math.log(1 + math.e) - 1
    t2 = math.log(1 + math.e + math.e**3) - 3
    assert qrank_loss(logits, labels, offsets).item() == pytest.approx((t1 + t2) / 2, abs=1e-5)
    # a trajectory with only wrong steps still has a loss: log(1 + sum_w e^(r_w + zeta))
    wrong = qrank_loss(torch.tensor([-1.0, 0.0]), torch.tensor([0.0, 0.0]), offsets, zeta=2.0)
    assert wrong.item() == pytest.approx(math.log(1 + math.e + math.e**2), abs=1e-5)


@pytest.mark.parametrize("name", ["bce", "mse", "qrank"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_logits_stay_finite(name, dtype):
    logits = torch.tensor([100.0, -100.0, 100.0, -100.0, 0.0], dtype=dtype, requires_grad=True)
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    loss = objective_loss(name, logits, labels, torch.tensor([0, 2, 5]))
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad.float()).all()
    if name == "bce":  # a confidently wrong step costs ~100 nats, not a clipped or infinite value
        assert loss.item() > 40


def test_soft_labels_accepted_by_bce_and_mse():
    logits, offsets = torch.tensor([0.0]), torch.tensor([0, 1])
    assert bce_loss(logits, torch.tensor([0.3]), offsets).item() == pytest.approx(math.log(2), abs=1e-6)
    assert mse_loss(logits, torch.tensor([0.3]), offsets).item() == pytest.approx(0.04, abs=1e-6)


def test_unknown_objective():
    with pytest.raises(ValueError, match="unknown objective"):
        objective_loss("hinge", LOGITS, LABELS, OFFSETS)
