"""Worked examples for ``compute_advantages``: every expected value is derived by hand in the comments.

Notation: ``mean_g`` / ``std_g`` are the group mean and the *unbiased* (n-1) group std; ``EPS = 1e-6`` is added to
the std before dividing (docs/math.md).
"""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import compute_advantages

EPS = 1e-6
NAN = float("nan")


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# Shared batch: group 0 = four samples, group 1 = two samples.
#   group 0 rewards [1, 0, 0, 0]: mean 0.25, deviations [0.75, -0.25, -0.25, -0.25],
#     sum of squares 0.5625 + 3 * 0.0625 = 0.75, unbiased var 0.75 / 3 = 0.25, std 0.5
#   group 1 rewards [1, 3]: mean 2, deviations [-1, 1], unbiased var 2 / 1 = 2, std sqrt(2) = 1.4142
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 3.0]
GROUPS = [0, 0, 0, 0, 1, 1]


def test_grpo_group_scale():
    adv = compute_advantages(_t(REWARDS), torch.tensor(GROUPS))
    # group 0: [0.75, -0.25, -0.25, -0.25] / (0.5 + eps) = [1.5, -0.5, -0.5, -0.5]
    # group 1: [-1, 1] / (1.4142 + eps) = [-0.7071, 0.7071]
    s0, s1 = 0.5 + EPS, math.sqrt(2.0) + EPS
    expected = _t([0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0, -1.0 / s1, 1.0 / s1])
    assert_close(adv, expected)
    assert adv.shape == (6,)


def test_grpo_group_scale_docstring_example():
    # group 0 [1, 0]: mean 0.5, unbiased std sqrt(0.5) = 0.7071 -> (1 - 0.5) / 0.7071 = 0.7071, and -0.7071
    # group 1 [1, 1]: all equal -> exactly 0
    adv = compute_advantages(_t([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert_close(adv, _t([a, -a, 0.0, 0.0]))


def test_grpo_scale_none_is_dr_grpo():
    adv = compute_advantages(_t(REWARDS), torch.tensor(GROUPS), scale="none")
    # r - mean_g, no division: group 0 mean 0.25 -> [0.75, -0.25, -0.25, -0.25]; group 1 mean 2 -> [-1, 1]
    assert_close(adv, _t([0.75, -0.25, -0.25, -0.25, -1.0, 1.0]))


def test_grpo_scale_batch():
    adv = compute_advantages(_t(REWARDS), torch.tensor(GROUPS), scale="batch")
    # batch of 6 rewards [1, 0, 0, 0, 1, 3]: n 6, sum 5, sum of squares 1 + 1 + 9 = 11, mean 5/6
    # unbiased var (11 - 6 * (5/6)^2) / 5 = (11 - 4.1667) / 5 = 1.3667, std 1.1690
    # advantages (r - mean_g) / (1.1690 + eps): [0.6416, -0.2139, -0.2139, -0.2139, -0.8554, 0.8554]
    std_batch = math.sqrt((11.0 - 6.0 * (5.0 / 6.0) ** 2) / 5.0) + EPS
    expected = _t([0.75, -0.25, -0.25, -0.25, -1.0, 1.0]) / std_batch
    assert_close(adv, expected)


def test_rloo():
    adv = compute_advantages(_t(REWARDS), torch.tensor(GROUPS), estimator="rloo")
    # group 0 [1, 0, 0, 0]: 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3 (three times)
    # group 1 [1, 3]: 1 - 3 = -2; 3 - 1 = 2
    # (check: rloo = G/(G-1) * (r - mean_g): 4/3 * 0.75 = 1, 4/3 * -0.25 = -1/3, 2 * -1 = -2)
    assert_close(adv, _t([1.0, -1 / 3, -1 / 3, -1 / 3, -2.0, 2.0]))


def test_rloo_ignores_scale():
    # scale only concerns grpo; rloo is a plain difference of rewards whatever the scale
    groups = torch.tensor(GROUPS)
    for scale in ("group", "batch", "none"):
        adv = compute_advantages(_t(REWARDS), groups, estimator="rloo", scale=scale)
        assert_close(adv, _t([1.0, -1 / 3, -1 / 3, -1 / 3, -2.0, 2.0]))


def test_reinforce_pp_baseline_whitens_over_valid_tokens():
    # groups: 0 = [1, 0], 1 = [2, 2] (constant), 2 = [3, 1]
    rewards = _t([1.0, 0.0, 2.0, 2.0, 3.0, 1.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    mask = torch.tensor(  # (N, T) lengths 2, 1, 2, 3, 1, 2
        [[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    )
    adv = compute_advantages(rewards, group_ids, estimator="reinforce_pp_baseline", completion_mask=mask)
    # r - mean_g: [0.5, -0.5, 0, 0, 1, -1], broadcast over valid tokens:
    #   values 0.5 x2, -0.5 x1, 0 x2, 0 x3, 1 x1, -1 x2  -> n 11 tokens
    #   sum 1 - 0.5 + 0 + 1 - 2 = -0.5, mean -0.5/11 = -0.04545
    #   sum of squares 2*0.25 + 0.25 + 1 + 2 = 3.75; unbiased var (3.75 - 11 * (0.5/11)^2) / 10 = 0.37273, std 0.61051
    # whitened (v + 0.04545) / 0.61051: 0.5 -> 0.8935, -0.5 -> -0.7445, 1 -> 1.7124, -1 -> -1.5635
    # the constant group 1 stays exactly 0 (it would otherwise become +0.0745); padding is 0
    mean = -0.5 / 11
    std = math.sqrt((3.75 - 11 * mean**2) / 10) + EPS

    def w(v):
        return (v - mean) / std

    expected = _t(
        [
            [w(0.5), w(0.5), 0.0],
            [w(-0.5), 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [w(1.0), 0.0, 0.0],
            [w(-1.0), w(-1.0), 0.0],
        ]
    )
    assert adv.shape == (6, 3)
    assert_close(adv, expected)
    assert torch.equal(adv[2:4], torch.zeros(2, 3))


def test_reinforce_pp_baseline_nan_row_left_out():
    # same batch as above plus a skipped row (NaN) in group 2 with 3 "valid" tokens: it must not enter the group
    # mean of group 2 (still [3, 1] -> mean 2) nor the whitening statistics, and it gets 0 everywhere
    rewards = _t([1.0, 0.0, 2.0, 2.0, 3.0, 1.0, NAN])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    adv = compute_advantages(rewards, group_ids, estimator="reinforce_pp_baseline", completion_mask=mask)
    # statistics identical to the previous test: mean -0.5/11, std 0.61051
    mean = -0.5 / 11
    std = math.sqrt((3.75 - 11 * mean**2) / 10) + EPS
    assert_close(adv[0, 0], torch.tensor((0.5 - mean) / std))  # 0.8935
    assert_close(adv[5, :2], _t([(-1.0 - mean) / std] * 2))  # -1.5635
    assert torch.equal(adv[6], torch.zeros(3))
    assert not torch.isnan(adv).any()


def test_non_contiguous_group_ids():
    # ids 7 and 3 interleaved: group 7 = rows 0, 2 = [1, 0]; group 3 = rows 1, 3 = [0, 2]
    adv = compute_advantages(_t([1.0, 0.0, 0.0, 2.0]), torch.tensor([7, 3, 7, 3]))
    # group 7: mean 0.5, std sqrt(0.5) -> [0.7071, -0.7071]; group 3: mean 1, std sqrt(2) -> [-0.7071, 0.7071]
    a7 = 0.5 / (math.sqrt(0.5) + EPS)
    a3 = 1.0 / (math.sqrt(2.0) + EPS)
    assert_close(adv, _t([a7, -a3, -a7, a3]))


def test_nan_rows_excluded_from_group_stats_grpo():
    # group 0 = [1, NaN, 0, 0] -> valid [1, 0, 0]: mean 1/3, deviations [2/3, -1/3, -1/3]
    #   sum of squares 4/9 + 1/9 + 1/9 = 2/3, unbiased var (2/3) / 2 = 1/3, std 0.5774
    # group 1 = [NaN, NaN]: no valid reward -> 0
    rewards = _t([1.0, NAN, 0.0, 0.0, NAN, NAN])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = compute_advantages(rewards, group_ids)
    s = math.sqrt(1 / 3) + EPS
    # [2/3, ., -1/3, -1/3] / 0.5774 = [1.1547, 0, -0.5774, -0.5774]
    assert_close(adv, _t([(2 / 3) / s, 0.0, (-1 / 3) / s, (-1 / 3) / s, 0.0, 0.0]))
    assert not torch.isnan(adv).any()


def test_nan_rows_excluded_scale_none_and_batch():
    rewards = _t([1.0, NAN, 0.0, 0.0, 1.0, 3.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1])
    # scale none: group 0 valid [1, 0, 0] mean 1/3 -> [2/3, 0, -1/3, -1/3]; group 1 [1, 3] mean 2 -> [-1, 1]
    centred = _t([2 / 3, 0.0, -1 / 3, -1 / 3, -1.0, 1.0])
    assert_close(compute_advantages(rewards, group_ids, scale="none"), centred)
    # scale batch: valid batch rewards [1, 0, 0, 1, 3] (the NaN row is left out): n 5, sum 5, mean 1,
    #   sum of squares 1 + 1 + 9 = 11, unbiased var (11 - 5 * 1) / 4 = 1.5, std 1.2247
    std_batch = math.sqrt(1.5) + EPS
    assert_close(compute_advantages(rewards, group_ids, scale="batch"), centred / std_batch)


def test_nan_rows_excluded_rloo():
    rewards = _t([1.0, NAN, 0.0, 0.0])
    adv = compute_advantages(rewards, torch.tensor([0, 0, 0, 0]), estimator="rloo")
    # valid [1, ., 0, 0]: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice); the NaN row gets 0
    assert_close(adv, _t([1.0, 0.0, -0.5, -0.5]))


@pytest.mark.parametrize(
    ("estimator", "scale"),
    [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("rloo", "group"), ("reinforce_pp_baseline", "group")],
)
def test_all_equal_group_is_exactly_zero(estimator, scale):
    # 0.3 is not exact in binary: a mean computed in floating point can differ from 0.3 by an ulp, and dividing that
    # by (0 + eps) would give a large spurious advantage. All-equal groups must give exactly 0 instead.
    rewards = _t([0.3, 0.3, 0.3, 0.7, 0.7, 0.7])  # two constant groups
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.ones(6, 2)
    adv = compute_advantages(rewards, group_ids, estimator=estimator, scale=scale, completion_mask=mask)
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize(
    ("estimator", "scale"),
    [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("rloo", "group"), ("reinforce_pp_baseline", "group")],
)
def test_one_member_group_is_zero(estimator, scale):
    # group 1 has one member (row 2), group 2 one valid member next to a NaN (rows 3, 4): no baseline -> 0
    rewards = _t([1.0, 0.0, 5.0, 4.0, NAN])
    group_ids = torch.tensor([0, 0, 1, 2, 2])
    mask = torch.ones(5, 2)
    adv = compute_advantages(rewards, group_ids, estimator=estimator, scale=scale, completion_mask=mask)
    assert torch.equal(adv[2:], torch.zeros_like(adv[2:]))
    assert (adv[0] > 0).all() and (adv[1] < 0).all()  # group 0 [1, 0] still has its signal


def _doubling_all_reduce(calls):
    def sum_across_ranks(x):
        # a fake all-reduce over two ranks that hold identical data: every summed moment doubles
        calls.append(x.clone())
        return x * 2

    return sum_across_ranks


def test_sum_across_ranks_used_for_batch_std():
    rewards = _t([1.0, 0.0, 2.0, 0.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    calls = []
    adv = compute_advantages(rewards, group_ids, scale="batch", sum_across_ranks=_doubling_all_reduce(calls))
    # local moments: n 4, sum 3, sum of squares 5; summed over the two "ranks": n 8, sum 6, sum of squares 10
    #   global mean 6/8 = 0.75, unbiased var (10 - 8 * 0.75^2) / 7 = 5.5 / 7 = 0.7857, std 0.8864
    #   (the local std would be sqrt((5 - 4 * 0.5625) / 3) = 0.9574: the result must come from the summed moments)
    # group 0 [1, 0] centred [0.5, -0.5]; group 1 [2, 0] centred [1, -1]; divided by 0.8864 + eps:
    #   [0.5641, -0.5641, 1.1282, -1.1282]
    std_global = math.sqrt(5.5 / 7) + EPS
    assert_close(adv, _t([0.5, -0.5, 1.0, -1.0]) / std_global)
    assert len(calls) >= 1


def test_sum_across_ranks_not_used_for_group_stats():
    # groups never straddle ranks: scale "group" and rloo stay local whatever the all-reduce returns
    rewards = _t([1.0, 0.0, 2.0, 0.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    fake = _doubling_all_reduce([])
    # group 0: 0.5 / sqrt(0.5) = 0.7071; group 1: 1 / sqrt(2) = 0.7071
    a0, a1 = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (math.sqrt(2.0) + EPS)
    assert_close(compute_advantages(rewards, group_ids, sum_across_ranks=fake), _t([a0, -a0, a1, -a1]))
    # rloo: [1 - 0, 0 - 1, 2 - 0, 0 - 2]
    adv = compute_advantages(rewards, group_ids, estimator="rloo", sum_across_ranks=fake)
    assert_close(adv, _t([1.0, -1.0, 2.0, -2.0]))


def test_sum_across_ranks_used_for_reinforce_pp_whitening():
    rewards = _t([1.0, 0.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    calls = []
    adv = compute_advantages(
        rewards,
        torch.tensor([0, 0]),
        estimator="reinforce_pp_baseline",
        completion_mask=mask,
        sum_across_ranks=_doubling_all_reduce(calls),
    )
    # token values [0.5, 0.5, -0.5]: local n 3, sum 0.5, sum of squares 0.75
    # doubled: n 6, sum 1, sum of squares 1.5 -> mean 1/6, unbiased var (1.5 - 6/36) / 5 = 0.26667, std 0.5164
    # whitened: (0.5 - 1/6) / 0.5164 = 0.6455; (-0.5 - 1/6) / 0.5164 = -1.2910
    mean = 1 / 6
    std = math.sqrt((1.5 - 6 * mean**2) / 5) + EPS
    p, n = (0.5 - mean) / std, (-0.5 - mean) / std
    assert_close(adv, _t([[p, p], [n, 0.0]]))
    assert len(calls) >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_preserved(dtype):
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=dtype)
    group_ids = torch.tensor([0, 0, 1, 1])
    adv = compute_advantages(rewards, group_ids)
    assert adv.dtype == dtype
    # 0.5 / sqrt(0.5) = 0.7071 (bf16: 0.70703125, within bf16 tolerance); constant group exactly 0
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert_close(adv, torch.tensor([a, -a, 0.0, 0.0], dtype=dtype))
    mask = torch.ones(4, 3)
    adv_pp = compute_advantages(rewards, group_ids, estimator="reinforce_pp_baseline", completion_mask=mask)
    assert adv_pp.dtype == dtype
    assert adv_pp.shape == (4, 3)


def test_bf16_rewards_computed_in_high_precision():
    # group [256, 258] in bf16 (both exact; bf16 steps by 2 between 256 and 512): mean 257, deviations -+1,
    # unbiased std sqrt(2) -> -+0.7071. A mean kept in bf16 would round 257 to 256 or 258 and give [0, 1.41] or
    # [-1.41, 0] instead.
    rewards = torch.tensor([256.0, 258.0], dtype=torch.bfloat16)
    adv = compute_advantages(rewards, torch.tensor([0, 0]))
    a = 1.0 / (math.sqrt(2.0) + EPS)
    assert_close(adv, torch.tensor([-a, a], dtype=torch.bfloat16))
