"""``clip_cov`` and ``kl_cov``: worked examples, the covariance selection in loops, seeding and bad settings."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import policy_loss
from lightning_grpo.config import GRPOConfig, ObjectiveConfig
from tests.algorithms.loss_reference import F64, MODES, advantage, check_against_loops, random_batch

ADV = torch.tensor([1.0, -1.0], dtype=F64)
ONES = torch.ones(2, 2)


def _clip_cov(lp, old, adv=ADV, mask=ONES, seed=0, **args):
    return policy_loss(lp, old, adv, mask, kind="clip_cov", kind_args=args, seed=seed)


def test_clip_cov_worked_example():
    # log π = [[-0.5, -2.5], [-0.5, -2.5]], A = +1, -1: means 0 and -1.5, so Cov = (A - 0)(log π + 1.5) =
    # [[1, -1], [-1, 1]]. Band (0.5, 5): tokens (0, 0) and (1, 1). Ratio 1 everywhere (nothing PPO-clipped);
    # clip_cov_ratio 0.5 of 4 tokens = 2: both band tokens lose their gradient, their value stays -A·r.
    lp = torch.tensor([[-0.5, -2.5], [-0.5, -2.5]], dtype=F64, requires_grad=True)
    loss, stats = _clip_cov(lp, lp.detach(), clip_cov_ratio=0.5, clip_cov_lb=0.5)
    assert_close(loss.detach(), torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=F64))
    loss.sum().backward()
    assert_close(lp.grad, torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64))
    assert_close(stats.extra["cov_selected_frac"], torch.tensor(0.5))


def test_clip_cov_leaves_ppo_clipped_tokens_out_of_the_band():
    # Token (0, 0) now has ratio 1.5 > 1.2 with A > 0: PPO clips it (value -1.2, gradient 0), so only (1, 1) is chosen.
    lp = torch.tensor([[-0.5, -2.5], [-0.5, -2.5]], dtype=F64, requires_grad=True)
    old = lp.detach() - torch.tensor([[math.log(1.5), 0.0], [0.0, 0.0]], dtype=F64)
    loss, stats = _clip_cov(lp, old, clip_cov_ratio=0.5, clip_cov_lb=0.5)
    assert_close(loss.detach(), torch.tensor([[-1.2, -1.0], [1.0, 1.0]], dtype=F64))
    loss.sum().backward()
    assert_close(lp.grad, torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64))
    assert_close(stats.extra["cov_selected_frac"], torch.tensor(0.25))
    assert_close(stats.clip_frac, torch.tensor(0.25))


def test_clip_cov_chooses_at_random_within_the_band_by_the_seed():
    # One of the two band tokens (count max(1, int(0.25·4)) = 1), chosen by the seed: the same seed, the same token;
    # over seeds, both.
    lp = torch.tensor([[-0.5, -2.5], [-0.5, -2.5]], dtype=F64)

    picks = set()
    for seed in range(12):
        lp_a = lp.clone().requires_grad_()
        _clip_cov(lp_a, lp, seed=seed, clip_cov_ratio=0.25, clip_cov_lb=0.5)[0].sum().backward()
        lp_b = lp.clone().requires_grad_()
        _clip_cov(lp_b, lp, seed=seed, clip_cov_ratio=0.25, clip_cov_lb=0.5)[0].sum().backward()
        assert torch.equal(lp_a.grad, lp_b.grad)  # seeded: repeatable
        zero = tuple(int(k) for k in (lp_a.grad == 0).nonzero()[0])
        assert zero in {(0, 0), (1, 1)} and int((lp_a.grad == 0).sum()) == 1
        picks.add(zero)
    assert picks == {(0, 0), (1, 1)}


def _covariances(batch):
    """Cov_t over the valid tokens, in loops: {(i, j): (A_ij - mean A)(log π_ij - mean log π)}."""
    cells = [(i, j) for i, length in enumerate(batch["lengths"]) for j in range(length)]
    lp, adv = batch["logprobs"], batch["adv"]
    mean_a = sum(advantage(adv, i, j) for i, j in cells) / len(cells)
    mean_lp = sum(float(lp[i, j]) for i, j in cells) / len(cells)
    return {(i, j): (advantage(adv, i, j) - mean_a) * (float(lp[i, j]) - mean_lp) for i, j in cells}


def _clip_cov_rows(batch, lp, lb, ub, count):
    old, cov, rows = batch["old"], _covariances(batch), []
    band = []
    for i, length in enumerate(batch["lengths"]):
        row = []
        for j in range(length):
            a, r = advantage(batch["adv"], i, j), torch.exp(lp[i, j] - float(old[i, j]))
            clipped = -a * min(max(float(r.detach()), 0.8), 1.2) > -a * float(r.detach())
            value = -a * r.clamp(0.8, 1.2) if clipped else -a * r
            if not clipped and lb < cov[i, j] < ub:
                band.append((i, j))
                value = value.detach()
            row.append(value)
        rows.append(row)
    assert 0 < len(band) <= count, "the test's data must select the whole band (no random choice)"
    return rows


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_clip_cov_equals_the_paper_in_loops(mode, per_token_adv):
    batch = random_batch(21, per_token_adv, spread=0.4)
    n = int(batch["mask"].sum())
    args = {"clip_cov_ratio": 0.9, "clip_cov_lb": 0.2, "clip_cov_ub": 1.5}
    check_against_loops(
        batch,
        lambda lp: policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind="clip_cov", kind_args=args)[0],
        lambda lp: _clip_cov_rows(batch, lp, 0.2, 1.5, int(0.9 * n)),
        mode,
    )


def test_kl_cov_worked_example():
    # log π = [[-0.5, -2.5], [-1.0, -1.5]], mean -1.375; A = +1, -1, mean 0: Cov = [[0.875, -1.125], [-0.375, 0.125]].
    # kl_cov_ratio 0.25 of 4 = 1 token: (0, 0), whose ratio is 1.5: loss -1.5 + |log 1.5| = -1.094535, gradient
    # -A·r + sign(log r) = -0.5. Other tokens: -A·1 and gradient -A.
    lp = torch.tensor([[-0.5, -2.5], [-1.0, -1.5]], dtype=F64, requires_grad=True)
    old = lp.detach() - torch.tensor([[math.log(1.5), 0.0], [0.0, 0.0]], dtype=F64)
    loss, stats = policy_loss(lp, old, ADV, ONES, kind="kl_cov", kind_args={"kl_cov_ratio": 0.25})
    assert_close(loss.detach(), torch.tensor([[-1.0945348919, -1.0], [1.0, 1.0]], dtype=F64))
    loss.sum().backward()
    assert_close(lp.grad, torch.tensor([[-0.5, -1.0], [1.0, 1.0]], dtype=F64))
    assert_close(stats.extra["cov_selected_frac"], torch.tensor(0.25))


def _kl_cov_rows(batch, lp, fraction, coef):
    cov = _covariances(batch)
    top = sorted(cov, key=cov.get, reverse=True)[: max(1, int(fraction * len(cov)))]
    rows = []
    for i, length in enumerate(batch["lengths"]):
        row = []
        for j in range(length):
            rho = lp[i, j] - float(batch["old"][i, j])
            value = -advantage(batch["adv"], i, j) * torch.exp(rho)
            row.append(value + coef * rho.abs() if (i, j) in top else value)
        rows.append(row)
    return rows


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_kl_cov_equals_the_paper_in_loops(mode, per_token_adv):
    batch = random_batch(22, per_token_adv)
    args = {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.7}
    check_against_loops(
        batch,
        lambda lp: policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind="kl_cov", kind_args=args)[0],
        lambda lp: _kl_cov_rows(batch, lp, 0.2, 0.7),
        mode,
    )


@pytest.mark.parametrize(
    ("kind", "args", "named"),
    [
        ("clip_cov", {"clip_cov_ratio": 0.0}, r"clip_cov_ratio must be a finite number in \(0.0, 1.0\)"),
        ("clip_cov", {"clip_cov_ratio": 1.0}, r"clip_cov_ratio must be a finite number in \(0.0, 1.0\)"),
        ("clip_cov", {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_ub must be a finite number > 5.0"),
        ("kl_cov", {"kl_cov_ratio": 1.5}, r"kl_cov_ratio must be a finite number in \(0.0, 1.0\)"),
        ("kl_cov", {"ppo_kl_coef": -1.0}, "ppo_kl_coef must be a finite number >= 0.0"),
    ],
)
def test_bad_settings_name_the_setting_and_its_range(kind, args, named):
    with pytest.raises(ValueError, match=named):
        GRPOConfig(objective=ObjectiveConfig(loss_kind=kind, loss_kind_args=args))
