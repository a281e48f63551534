"""``sapo``, ``gmpo`` and ``gpg``: worked examples, the papers' formulas in loops, and bad settings.

Worked examples build tokens from chosen ratios (``logprobs = old + log r``), as test_policy_losses.py does.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import PolicyLossTerms, aggregate_loss, policy_loss
from lightning_grpo.config import GRPOConfig, ObjectiveConfig
from tests.algorithms.loss_reference import (
    F64,
    MODES,
    advantage,
    check_against_loops,
    per_token_loops,
    random_batch,
    sigmoid,
)


def _tokens(ratios, old=-1.0):
    ratios = torch.tensor(ratios, dtype=F64)
    old_logprobs = torch.full_like(ratios, old)
    return (old_logprobs + ratios.log()).requires_grad_(True), old_logprobs


def _t(values):
    return torch.tensor(values, dtype=F64)


# ---------------------------------------------------------------- SAPO


def test_sapo_worked_example():
    # Row 0, A = +1 (tau_pos = 1): r = 1 -> f = 4·σ(0) = 2, loss -2, d loss/d logp = -A·4σ(1-σ)·r = -1;
    #   r = 2 -> σ(1) = 0.731059, f = 2.924234, loss -2.924234, grad -(4·0.731059·0.268941)·2 = -1.572895.
    # Row 1, A = -1 (tau_neg = 1.05): r = 1 -> f = 4/1.05·0.5 = 1.904762, loss +1.904762, grad +1;
    #   r = 0.5 -> σ(-0.525) = 0.371686, f = 1.415938, loss +1.415938, grad 4·σ(1-σ)·0.5 = 0.467070.
    lp, old = _tokens([[1.0, 2.0], [1.0, 0.5]])
    loss, stats = policy_loss(lp, old, _t([1.0, -1.0]), torch.ones(2, 2), kind="sapo")
    assert_close(loss.detach(), _t([[-2.0, -2.9242343145], [1.9047619048, 1.4159383303]]))
    loss.sum().backward()
    assert_close(lp.grad, _t([[-1.0, -1.5728954659], [1.0, 0.4670699116]]))
    # The gate's gradient weight 4σ(1-σ): 1, 0.786448, 1, 0.934140 -> mean 0.930147.
    assert_close(stats.extra["sapo_gate_mean"], torch.tensor(0.9301468891, dtype=torch.float32))
    assert stats.clip_frac == 0  # no hard clip


def _sapo_token(tau_pos, tau_neg):
    def token(lp, old, a):
        tau = tau_pos if a > 0 else tau_neg
        return -a * (4.0 / tau) * sigmoid(tau * (torch.exp(lp - old) - 1.0))

    return token


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_sapo_equals_the_paper_in_loops(seed, mode, per_token_adv):
    batch = random_batch(seed, per_token_adv)
    args = {"tau_pos": 0.7, "tau_neg": 1.3}
    check_against_loops(
        batch,
        lambda lp: policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind="sapo", kind_args=args)[0],
        lambda lp: per_token_loops(batch, lp, _sapo_token(0.7, 1.3)),
        mode,
    )


# ---------------------------------------------------------------- GMPO


def test_gmpo_worked_example():
    # Row 0, A = +1, log-ratios 0.1, 0.6, -0.7, clip ±0.4 in log space: for A > 0 the smaller of ρ and clip(ρ) is
    #   kept -> 0.1, 0.4 (clipped), -0.7; mean -0.2/3; ratio e^(-0.0667) = 0.935507; loss -0.935507 on each token.
    # Row 1, A = -2, log-ratios 0.6, -0.7 (and padding): for A < 0 the larger -> 0.6, -0.4 (clipped); mean 0.1;
    #   ratio e^0.1 = 1.105171; loss 2.210342.
    # seq-mean-token-mean = (-0.935507 + 2.210342) / 2 = 0.637417; gradients: row 0's unclipped tokens
    #   -A·R/|o|/2 = -0.935507/3/2 = -0.155918, row 1's unclipped token 2·1.105171/2/2 = 0.552585, clipped ones 0.
    old = torch.full((2, 3), -1.5, dtype=F64)
    lp = (old + _t([[0.1, 0.6, -0.7], [0.6, -0.7, 0.0]])).requires_grad_(True)
    mask = _t([[1, 1, 1], [1, 1, 0]])
    loss, stats = policy_loss(lp, old, _t([1.0, -2.0]), mask, kind="gmpo")
    assert_close(loss.detach()[0], torch.full((3,), -0.9355069850, dtype=F64))
    assert_close(loss.detach()[1, :2], torch.full((2,), 2.2103418362, dtype=F64))
    total = aggregate_loss(loss, mask, "seq-mean-token-mean")
    assert_close(total.detach(), torch.tensor(0.6374174256, dtype=F64))
    total.backward()
    assert_close(lp.grad, _t([[-0.1559178308, 0.0, -0.1559178308], [0.5525854590, 0.0, 0.0]]))
    assert_close(stats.clip_frac, torch.tensor(2 / 5))  # the two clipped tokens of five
    # The sequence ratio, token-weighted: (3·0.935507 + 2·1.105171) / 5 = 1.003373.
    assert_close(stats.extra["gmpo_seq_ratio_mean"], torch.tensor(1.0033725, dtype=torch.float32))


def _gmpo_rows(batch, lp, low, high):
    """The paper's sequence term -A_i·exp(mean_t sgn(A)·min(sgn(A)·ρ, sgn(A)·clip(ρ))), on each valid token."""
    old, adv, rows = batch["old"], batch["adv"], []
    for i, length in enumerate(batch["lengths"]):
        chosen, advs = [], []
        for j in range(length):
            rho = lp[i, j] - float(old[i, j])
            a = advantage(adv, i, j)
            sign = (a > 0) - (a < 0)
            bounded = rho.clamp(-low, high)
            chosen.append(sign * torch.minimum(sign * rho, sign * bounded) if sign else rho)
            advs.append(a)
        if length:
            value = -(sum(advs) / length) * torch.exp(sum(chosen) / length)
            rows.append([value] * length)
        else:
            rows.append([])
    return rows


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_equals_the_paper_in_loops(seed, mode, per_token_adv):
    """``seq-mean-token-mean`` is the paper's mean over sequences; the other modes weigh sequence terms by length."""
    batch = random_batch(seed, per_token_adv, spread=0.9)
    args = {"log_clip_low": 0.3, "log_clip_high": 0.5}
    check_against_loops(
        batch,
        lambda lp: policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind="gmpo", kind_args=args)[0],
        lambda lp: _gmpo_rows(batch, lp, 0.3, 0.5),
        mode,
    )


def test_gmpo_seq_mean_token_mean_is_the_mean_over_sequences():
    batch = random_batch(3, per_token_adv=False, spread=0.9)
    lp = batch["logprobs"]
    loss, _ = policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind="gmpo")
    rows = [row[0] for row in _gmpo_rows(batch, lp, 0.4, 0.4) if row]
    want = sum(rows) / len(rows)
    assert_close(aggregate_loss(loss, batch["mask"], "seq-mean-token-mean"), want)


# ---------------------------------------------------------------- GPG


def test_gpg_worked_example():
    # loss = -A·log π whatever the old log-probs: A = 2, log π = -0.5, -1.0 -> 1.0, 2.0; A = -1, log π = -2 -> -2.
    # Gradient -A: -2, -2, 1.
    lp = _t([[-0.5, -1.0], [-2.0, -3.0]]).requires_grad_(True)
    old = _t([[-9.0, -0.1], [-2.0, -5.0]])
    loss, stats = policy_loss(lp, old, _t([2.0, -1.0]), _t([[1, 1], [1, 0]]), kind="gpg")
    assert_close(loss.detach()[:, 0], _t([1.0, -2.0]))
    assert_close(loss.detach()[0, 1], torch.tensor(2.0, dtype=F64))
    (loss * _t([[1, 1], [1, 0]])).sum().backward()
    assert_close(lp.grad, _t([[-2.0, -2.0], [1.0, 0.0]]))
    assert stats.clip_frac == 0


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_gpg_equals_the_paper_in_loops(mode, per_token_adv):
    batch = random_batch(5, per_token_adv)
    check_against_loops(
        batch,
        lambda lp: policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind="gpg")[0],
        lambda lp: per_token_loops(batch, lp, lambda lp_ij, old, a: -a * lp_ij),
        mode,
    )


# ---------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    ("kind", "args", "named"),
    [
        ("sapo", {"tau_pos": 0.0}, "tau_pos must be a finite number > 0.0"),
        ("sapo", {"tau_neg": -1.0}, "tau_neg must be a finite number > 0.0"),
        ("gmpo", {"log_clip_low": -0.1}, "log_clip_low must be a finite number >= 0.0"),
        ("gmpo", {"log_clip_high": math.nan}, "log_clip_high"),
        ("gpg", {"clip_low": 0.1}, "takes no settings"),
    ],
)
def test_bad_settings_name_the_setting_and_its_range(kind, args, named):
    with pytest.raises(ValueError, match=named):
        GRPOConfig(objective=ObjectiveConfig(loss_kind=kind, loss_kind_args=args))
    with pytest.raises(ValueError, match=named):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), kind=kind, kind_args=args)


# ---------------------------------------------------------------- every new loss, on-policy


# gmpo with per-token advantages averages them over the sequence: another gradient by design, not compared.
@pytest.mark.parametrize(
    ("kind", "per_token_adv"),
    [
        (k, p)
        for k in ("sapo", "gmpo", "dppo_tv", "dppo_kl", "kl_cov", "gpg")
        for p in (False, True)
        if (k, p) != ("gmpo", True)
    ],
)
def test_on_policy_every_loss_has_grpos_gradient(kind, per_token_adv):
    """At ``π_old = π_θ`` (one update per rollout) the gates are open, nothing is masked, no KL-Cov penalty acts:
    the gradient is GRPO's (``clip``'s) under ``seq-mean-token-mean`` — for ``gmpo`` too, whose sequence term's
    gradient is ``-A/|o|`` per token. (``clip_cov`` removes its chosen tokens' gradient even on-policy.)"""
    batch = random_batch(7, per_token_adv)
    grads = []
    for name in ("clip", kind):
        lp = batch["logprobs"].clone().requires_grad_()
        loss, _ = policy_loss(lp, lp.detach(), batch["adv"], batch["mask"], kind=name)
        grads.append(torch.autograd.grad(aggregate_loss(loss, batch["mask"], "seq-mean-token-mean"), lp)[0])
    assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-12)


def clashing_loss(logprobs, old_logprobs, advantages, mask, settings):
    return PolicyLossTerms(-advantages * logprobs, logprobs.exp(), metrics={"entropy": logprobs})


def test_a_loss_metric_may_not_take_a_name_the_objective_logs():
    with pytest.raises(ValueError, match="may not be named 'entropy'"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2),
                    kind=f"{__name__}.clashing_loss")  # fmt: skip
