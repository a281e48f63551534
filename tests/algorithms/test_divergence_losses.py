"""``dppo_tv`` and ``dppo_kl``: worked examples, the binary trust region in loops, and bad settings."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import policy_loss
from lightning_grpo.config import GRPOConfig, ObjectiveConfig
from tests.algorithms.loss_reference import F64, MODES, check_against_loops, per_token_loops, random_batch

# Old probability 0.5 everywhere. Row 0, A = +1: p = 0.6 (up 0.1), 0.8 (up 0.3), 0.2 (down 0.3);
# row 1, A = -1: p = 0.2 (down 0.3), 0.45 (down 0.05), 0.9 (up 0.4).
PROBS = [[0.6, 0.8, 0.2], [0.2, 0.45, 0.9]]
ADV = torch.tensor([1.0, -1.0], dtype=F64)


def _batch(probs=PROBS, old_prob=0.5):
    lp = torch.tensor(probs, dtype=F64).log().requires_grad_(True)
    return lp, torch.full_like(lp, math.log(old_prob)).detach()


def test_dppo_tv_worked_example():
    # Threshold 0.15 (the default) on |p - p_old|, one-sided: A > 0 masks a rise above 0.15 (p 0.8: +0.3), A < 0 a
    # fall below -0.15 (p 0.2 of row 1: -0.3); p 0.2 in row 0 fell (A > 0 pushes up: kept), p 0.9 in row 1 rose
    # (A < 0 pushes down: kept).
    # Kept tokens: loss -A·r·log p with r = p / 0.5, gradient -A·r:
    #   row 0: p 0.6 -> -1.2·log 0.6 = 0.612991 (grad -1.2); p 0.2 -> -0.4·log 0.2 = 0.643775 (grad -0.4)
    #   row 1: p 0.45 -> 0.9·log 0.45 = -0.718657 (grad 0.9); p 0.9 -> 1.8·log 0.9 = -0.189649 (grad 1.8)
    lp, old = _batch()
    loss, stats = policy_loss(lp, old, ADV, torch.ones(2, 3), kind="dppo_tv")
    assert_close(loss.detach(), torch.tensor([[0.6129907485, 0.0, 0.6437751650], [0.0, -0.7186569266, -0.1896489282]],
                                             dtype=F64))  # fmt: skip
    loss.sum().backward()
    assert_close(lp.grad, torch.tensor([[-1.2, 0.0, -0.4], [0.0, 0.9, 1.8]], dtype=F64))
    assert_close(stats.extra["dppo_masked_frac"], torch.tensor(2 / 6))
    assert_close(stats.clip_frac, torch.tensor(2 / 6))  # the masked tokens are the loss's "clipped" ones
    assert_close(stats.extra["dppo_divergence_mean"], torch.tensor(0.2416666667))  # (.1+.3+.3+.3+.05+.4)/6
    assert stats.extra["dppo_ratio_capped_frac"] == 0  # no cap by default (the authors' recipe)


def test_dppo_tv_ratio_cap_truncates_the_weight():
    # ratio_cap 1.5: row 1's p 0.9 has r = 1.8 -> weight 1.5: loss 1.5·log 0.9 = -0.158041, gradient 1.5.
    lp, old = _batch()
    loss, stats = policy_loss(lp, old, ADV, torch.ones(2, 3), kind="dppo_tv", kind_args={"ratio_cap": 1.5})
    assert_close(loss.detach()[1, 2], torch.tensor(-0.1580407735, dtype=F64))
    loss.sum().backward()
    assert_close(lp.grad[1, 2], torch.tensor(1.5, dtype=F64))
    assert_close(stats.extra["dppo_ratio_capped_frac"], torch.tensor(2 / 6))  # r 1.6 (masked) and 1.8 exceed 1.5


def test_dppo_kl_worked_example_differs_from_tv_on_rare_tokens():
    # Binary KL from p_old 0.5: p 0.6 -> 0.020411, 0.8 -> 0.223144, 0.2 -> 0.223144, 0.45 -> 0.005025, 0.9 -> 0.510826
    # Threshold 0.05 with the same one-sided rule masks the same two tokens as TV above. A third row (old p 0.02,
    # A = +1) rises to p 0.1: |Δp| = 0.08 (kept by TV at 0.15) but KL = 0.02·log(0.2) + 0.98·log(0.98/0.9) = 0.051266
    # > 0.05: masked by KL.
    probs = [*PROBS, [0.1, 0.1, 0.1]]
    lp = torch.tensor(probs, dtype=F64).log().requires_grad_(True)
    old = torch.tensor([[0.5] * 3, [0.5] * 3, [0.02] * 3], dtype=F64).log()
    adv, mask = torch.tensor([1.0, -1.0, 1.0], dtype=F64), torch.tensor([[1.0] * 3, [1.0] * 3, [1.0, 0.0, 0.0]])
    loss, stats = policy_loss(lp, old, adv, mask, kind="dppo_kl")
    assert_close(loss.detach()[:2], torch.tensor([[0.6129907485, 0.0, 0.6437751650],
                                                  [0.0, -0.7186569266, -0.1896489282]], dtype=F64))  # fmt: skip
    assert loss[2, 0] == 0
    assert_close(stats.extra["dppo_masked_frac"], torch.tensor(3 / 7))
    tv, _ = policy_loss(lp, old, adv, mask, kind="dppo_tv")
    assert_close(tv.detach()[2, 0], torch.tensor(-5 * math.log(0.1), dtype=F64))  # kept by TV: -A·5·log 0.1


def _tv_token(low, high):
    def token(lp, old, a):
        p, q = math.exp(float(lp.detach())), math.exp(old)
        keep = p - q <= high if a > 0 else q - p <= low
        return -a * math.exp(float(lp.detach()) - old) * lp if keep else lp * 0.0

    return token


def _kl_token(low, high):
    def token(lp, old, a):
        p, q = math.exp(float(lp.detach())), math.exp(old)
        kl = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
        keep = (kl <= high or p <= q) if a > 0 else (kl <= low or p >= q)
        return -a * math.exp(float(lp.detach()) - old) * lp if keep else lp * 0.0

    return token


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("kind", "token", "low", "high"), [("dppo_tv", _tv_token, 0.1, 0.15),
                                                             ("dppo_kl", _kl_token, 0.02, 0.04)])  # fmt: skip
def test_dppo_equals_the_binary_trust_region_in_loops(kind, token, low, high, mode, per_token_adv):
    batch = random_batch(11, per_token_adv, spread=0.8)
    args = {"threshold_low": low, "threshold_high": high}
    _, stats = policy_loss(batch["logprobs"], batch["old"], batch["adv"], batch["mask"], kind=kind, kind_args=args)
    assert 0 < stats.extra["dppo_masked_frac"] < 1  # both branches are exercised
    check_against_loops(
        batch,
        lambda lp: policy_loss(lp, batch["old"], batch["adv"], batch["mask"], kind=kind, kind_args=args)[0],
        lambda lp: per_token_loops(batch, lp, token(low, high)),
        mode,
    )


@pytest.mark.parametrize(
    ("kind", "args", "named"),
    [
        ("dppo_tv", {"threshold_low": 0.0}, "threshold_low must be a finite number > 0.0"),
        ("dppo_kl", {"threshold_high": -0.1}, "threshold_high must be a finite number > 0.0"),
        ("dppo_tv", {"ratio_cap": 0.5}, "ratio_cap must be a finite number >= 1.0 or None"),
        ("dppo_kl", {"clip_low": 0.1}, "takes no setting 'clip_low'"),
    ],
)
def test_bad_settings_name_the_setting_and_its_range(kind, args, named):
    with pytest.raises(ValueError, match=named):
        GRPOConfig(objective=ObjectiveConfig(loss_kind=kind, loss_kind_args=args))
