"""GDPO, pass@k, OPO, REINFORCE++ and GPG: hand-worked examples (numbers derived in the comments) and random inputs
against each paper's formula written here with plain loops in float64 (docs/math.md, one section each).

Notation: ``mean_g`` / ``std_g`` are the group mean and unbiased group std over rows some reward function scored.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import compute_advantages, estimator_needs

EPS = 1e-6
NAN = float("nan")
F64 = torch.float64


def _t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


# ---------------------------------------------------------------- hand-worked examples


def test_gdpo_worked_example():
    # groups: rows 0-2 (g0), rows 3-4 (g1); weights f1: 1, f2: 2
    # g0 f1 [1, 0, 0]: mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = 1/sqrt(3) -> [2/sqrt3, -1/sqrt3, -1/sqrt3]
    # g0 f2 [0, 1, 1]: mirror image -> [-2/sqrt3, 1/sqrt3, 1/sqrt3], times 2 -> [-4/sqrt3, 2/sqrt3, 2/sqrt3]
    # g0 sum: [-2/sqrt3, 1/sqrt3, 1/sqrt3]
    # g1 f1 [2, 0]: mean 1, std sqrt2 -> [1/sqrt2, -1/sqrt2]; g1 f2 [1, 1]: constant -> [0, 0]
    # batch of sums: mean 0, squares 4/3 + 1/3 + 1/3 + 1/2 + 1/2 = 3, unbiased var 3/4, std sqrt3/2
    # whitened: [-4/3, 2/3, 2/3, 2/sqrt6, -2/sqrt6]
    f1, f2 = _t([1.0, 0, 0, 2, 0]), _t([0.0, 1, 1, 1, 1])
    adv = compute_advantages(
        f1 + 2 * f2, torch.tensor([0, 0, 0, 1, 1]), estimator="gdpo",
        function_rewards={"f1": f1, "f2": f2}, function_weights={"f1": 1.0, "f2": 2.0},
    )  # fmt: skip
    s6 = 2 / math.sqrt(6)
    assert_close(adv, _t([-4 / 3, 2 / 3, 2 / 3, s6, -s6]), rtol=1e-5, atol=1e-5)


def test_gdpo_keeps_signal_where_the_weighted_sum_is_constant():
    # f1 [1, 0], f2 [0, 2], weights 2 and 1: the sums [2, 2] are equal (grpo: 0), but f1 -> [1/sqrt2, -1/sqrt2] and
    # f2 -> [-1/sqrt2, 1/sqrt2]: 2 f1 + f2 = [1/sqrt2, -1/sqrt2], std over the batch 1, whitened [0.7071, -0.7071]
    f1, f2 = _t([1.0, 0.0]), _t([0.0, 2.0])
    weighted = 2 * f1 + f2
    group = torch.tensor([0, 0])
    assert_close(compute_advantages(weighted, group), _t([0.0, 0.0]))
    adv = compute_advantages(weighted, group, estimator="gdpo", function_rewards={"f1": f1, "f2": f2},
                             function_weights={"f1": 2.0, "f2": 1.0})  # fmt: skip
    assert_close(adv, _t([1 / math.sqrt(2), -1 / math.sqrt(2)]), rtol=1e-5, atol=1e-5)


def test_passk_verl_form_worked_example():
    # g0 [0.2, 0.9, 0.5, 0.7]: best 0.9 (row 1), runner-up 0.7: gap 0.2; mean 0.575, squares of deviations
    #   0.140625 + 0.105625 + 0.005625 + 0.015625 = 0.2675, unbiased std sqrt(0.2675 / 3) = 0.298608 -> 0.66977
    # g1 [1, 0]: gap 1, std sqrt(0.5) -> 1.41421 for row 4; every other row 0
    rewards, groups = _t([0.2, 0.9, 0.5, 0.7, 1.0, 0.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    adv = compute_advantages(rewards, groups, estimator="grpo_passk")
    expected = _t([0.0, 0.2 / (math.sqrt(0.2675 / 3) + EPS), 0.0, 0.0, 1 / (math.sqrt(0.5) + EPS), 0.0])
    assert_close(adv, expected)
    assert_close(compute_advantages(rewards, groups, estimator="grpo_passk", scale="none"),
                 _t([0.0, 0.2, 0.0, 0.0, 1.0, 0.0]))  # fmt: skip
    # scale="batch": the unbiased std of all six rewards (mean 0.55, squares of deviations 0.775)
    batch_std = math.sqrt(0.775 / 5) + EPS
    assert_close(compute_advantages(rewards, groups, estimator="grpo_passk", scale="batch"),
                 _t([0.0, 0.2 / batch_std, 0.0, 0.0, 1.0 / batch_std, 0.0]))  # fmt: skip


def test_passk_first_of_equal_best_gets_zero_gap():
    # [0.9, 0.3, 0.9]: the best (row 0) and the runner-up (row 2) are equal: gap 0 for every row
    adv = compute_advantages(_t([0.9, 0.3, 0.9]), torch.tensor([0, 0, 0]), estimator="grpo_passk")
    assert_close(adv, _t([0.0, 0.0, 0.0]))


def test_passk_analytic_worked_example():
    # k = 2, g0 [1, 0, 0, 0]: N 4, N_neg 3: R = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2, sigma = sqrt(1/4) = 1/2
    #   correct: (1 - 1/2) / (1/2) = 1; wrong: (1 - 1/2 - C(2,1)/C(3,1)) / (1/2) = (1/2 - 2/3) * 2 = -1/3
    # g1 [1, 1, 0]: N_neg 1 < k, every pair holds a correct one: R = 1, sigma 0 -> 0
    adv = compute_advantages(_t([1.0, 0, 0, 0, 1, 1, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1]),
                             estimator="grpo_passk", estimator_args={"k": 2})  # fmt: skip
    assert_close(adv, _t([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]))


def test_passk_k1_is_grpo_with_the_population_std():
    # k = 1: R = N_pos / N = p, sigma = sqrt(p (1 - p)); correct (1 - p) / sigma, wrong (1 - p - 1) / sigma = -p / sigma
    # [1, 0, 0, 0]: p 1/4, sigma sqrt(3)/4 -> [3/sqrt3, -1/sqrt3, ...] = [sqrt3, -1/sqrt3, -1/sqrt3, -1/sqrt3]
    adv = compute_advantages(_t([1.0, 0, 0, 0]), torch.tensor([0] * 4), estimator="grpo_passk",
                             estimator_args={"k": 1})  # fmt: skip
    s3 = math.sqrt(3)
    assert_close(adv, _t([s3, -1 / s3, -1 / s3, -1 / s3]))


def test_opo_worked_example():
    # g0 rewards [1, 0, 1], lengths [2, 4, 3]: baseline (2 + 0 + 3) / 9 = 5/9 -> [4/9, -5/9, 4/9]
    # g1 rewards [0, 1], lengths [1, 3]: baseline 3/4 -> [-3/4, 1/4]
    mask = _t([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1]])  # row 4: a hole at the start
    adv = compute_advantages(_t([1.0, 0, 1, 0, 1]), torch.tensor([0, 0, 0, 1, 1]), estimator="opo",
                             completion_mask=mask)  # fmt: skip
    assert_close(adv, _t([4 / 9, -5 / 9, 4 / 9, -3 / 4, 1 / 4]))


def test_reinforce_plus_plus_worked_example():
    # gamma 0.5, rewards [1, 0, 2]; masks [1,1,1], [1,1,0], [1,0,1] (a hole: an environment's token)
    # sampled tokens after each: row 0 [2, 1, 0] -> [0.25, 0.5, 1]; row 1 -> [0, 0]; row 2 [1, -, 0] -> [1, -, 2]
    # the 7 values: sum 4.75, mean 0.678571; squares 6.3125, unbiased var (6.3125 - 4.75^2/7) / 6 = 0.514881
    mask = _t([[1, 1, 1], [1, 1, 0], [1, 0, 1]])
    adv = compute_advantages(_t([1.0, 0, 2]), torch.tensor([0, 0, 0]), estimator="reinforce_plus_plus",
                             estimator_args={"gamma": 0.5}, completion_mask=mask)  # fmt: skip
    mean, std = 4.75 / 7, math.sqrt((6.3125 - 4.75**2 / 7) / 6) + EPS
    z = lambda x: (x - mean) / std  # noqa: E731
    assert_close(adv, _t([[z(0.25), z(0.5), z(1.0)], [z(0.0), z(0.0), 0.0], [z(1.0), 0.0, z(2.0)]]))


def test_gpg_worked_example():
    # groups g0 [1, 0, 0, 0], g1 [1, 1] (all equal), g2 [0, 2]; B = 8 rows, M = 2 in an all-equal group
    # alpha "valid" (paper) 8 / (8 - 2) = 4/3: g0 (r - 1/4) * 4/3 = [1, -1/3, -1/3, -1/3]; g1 0; g2 [-4/3, 4/3]
    # alpha "nonzero" (verl): 4 non-zero rewards -> 8/4 = 2: g0 [1.5, -0.5, ...], g2 [-2, 2]; f_norm 2 halves it
    rewards, groups = _t([1.0, 0, 0, 0, 1, 1, 0, 2]), torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    third = 1 / 3
    assert_close(compute_advantages(rewards, groups, estimator="gpg"),
                 _t([1.0, -third, -third, -third, 0, 0, -4 * third, 4 * third]))  # fmt: skip
    adv = compute_advantages(rewards, groups, estimator="gpg", estimator_args={"alpha": "nonzero", "f_norm": 2.0})
    assert_close(adv, _t([0.75, -0.25, -0.25, -0.25, 0, 0, -1.0, 1.0]))


# ---------------------------------------------------------------- random inputs against the formulas (loops)


def _random_batch(seed: int, *, binary: bool = False):
    """Uneven, interleaved groups; ~15% NaN rewards; masks of uneven lengths with holes."""
    rng = random.Random(seed)
    sizes = [rng.randint(2, 6) for _ in range(rng.randint(2, 5))]
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    rng.shuffle(groups)
    n, t = len(groups), rng.randint(2, 7)

    def reward():
        if rng.random() < 0.15:
            return NAN
        return float(rng.random() < 0.5) if binary else rng.choice([0.0, 1.0, rng.uniform(-2, 3)])

    rewards = [reward() for _ in range(n)]
    mask = [[float(rng.random() < 0.8) for _ in range(t)] for _ in range(n)]
    for row in mask:
        row[rng.randrange(t)] = 1.0  # every row samples a token
    return rewards, groups, mask


def _members(groups, rewards):
    out: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        if not math.isnan(rewards[i]):
            out.setdefault(g, []).append(i)
    return out


def _std(values):
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _whiten(values, keep):
    xs = [v for v, k in zip(values, keep, strict=True) if k]
    mean, std = sum(xs) / len(xs), _std(xs)
    return [(v - mean) / (std + EPS) if k else 0.0 for v, k in zip(values, keep, strict=True)]


def gdpo_loops(functions, weights, groups):
    n = len(groups)
    valid = [any(not math.isnan(f[i]) for f in functions.values()) for i in range(n)]
    total = [0.0] * n
    for name, f in functions.items():
        for members in _members(groups, [f[i] if valid[i] else NAN for i in range(n)]).values():
            values = [f[i] for i in members]
            mean, std = sum(values) / len(values), _std(values)
            for i in members:
                total[i] += weights[name] * (f[i] - mean) / (std + EPS)
    return _whiten(total, valid)


@pytest.mark.parametrize("seed", range(8))
def test_gdpo_random_against_loops(seed):
    rewards, groups, _ = _random_batch(seed)
    rng = random.Random(seed + 100)
    f1 = list(rewards)
    f2 = [NAN if math.isnan(r) else rng.uniform(0, 1) for r in rewards]  # scored exactly where f1 is
    f3_group = {g: rng.random() < 0.3 for g in set(groups)}  # None for whole groups: adds nothing there
    f3 = [
        NAN if math.isnan(r) or f3_group[g] else float(rng.randint(0, 3)) for r, g in zip(rewards, groups, strict=True)
    ]
    weights = {"f1": 1.0, "f2": 0.5, "f3": 2.0}
    functions = {"f1": f1, "f2": f2, "f3": f3}
    summed = [NAN if math.isnan(a) else sum(weights[k] * (0 if math.isnan(f[i]) else f[i])
              for k, f in functions.items()) for i, a in enumerate(f1)]  # fmt: skip
    adv = compute_advantages(
        _t(summed),
        torch.tensor(groups),
        estimator="gdpo",
        function_rewards={k: _t(v) for k, v in functions.items()},
        function_weights=weights,
    )
    assert_close(adv, _t(gdpo_loops(functions, weights, groups)), rtol=1e-9, atol=1e-9)


def passk_loops(rewards, groups, k, eps=EPS):
    out = [0.0] * len(rewards)
    for members in _members(groups, rewards).values():
        values = [rewards[i] for i in members]
        if k is None:
            if len(values) < 2:
                continue
            best = max(values)
            first = next(i for i in members if rewards[i] == best)
            second = max(rewards[i] for i in members if i != first)
            out[first] = (best - second) / (_std(values) + eps)
            continue
        n, neg = len(values), sum(1 for v in values if v == 0)
        kk = min(k, n)
        mean = 1 - math.comb(neg, kk) / math.comb(n, kk)
        sigma = math.sqrt(mean * (1 - mean))
        if sigma == 0:
            continue
        wrong_all = math.comb(neg - 1, kk - 1) / math.comb(n - 1, kk - 1) if neg >= 1 else 0.0
        for i in members:
            out[i] = ((1 - mean) if rewards[i] == 1 else (1 - mean - wrong_all)) / sigma
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [None, 1, 2, 3, 8])
def test_passk_random_against_loops(seed, k):
    rewards, groups, _ = _random_batch(seed, binary=k is not None)
    args = {"k": k} if k is not None else None
    adv = compute_advantages(_t(rewards), torch.tensor(groups), estimator="grpo_passk", estimator_args=args)
    assert_close(adv, _t(passk_loops(rewards, groups, k)), rtol=1e-9, atol=1e-9)


def opo_loops(rewards, groups, mask):
    out = [0.0] * len(rewards)
    for members in _members(groups, rewards).values():
        lengths = [sum(mask[i]) for i in members]
        baseline = sum(l * rewards[i] for l, i in zip(lengths, members, strict=True)) / sum(lengths)  # noqa: E741
        for i in members:
            out[i] = rewards[i] - baseline
    return out


@pytest.mark.parametrize("seed", range(8))
def test_opo_random_against_loops(seed):
    rewards, groups, mask = _random_batch(seed)
    adv = compute_advantages(_t(rewards), torch.tensor(groups), estimator="opo", completion_mask=_t(mask))
    assert_close(adv, _t(opo_loops(rewards, groups, mask)), rtol=1e-9, atol=1e-9)


def reinforce_pp_loops(rewards, mask, gamma):
    values, keep = [], []
    for r, row in zip(rewards, mask, strict=True):
        for t, m in enumerate(row):
            after = sum(row[t + 1 :])
            keep.append(bool(m) and not math.isnan(r))
            values.append(0.0 if math.isnan(r) else gamma**after * r)
    flat = _whiten(values, keep)
    width = len(mask[0])
    return [flat[i * width : (i + 1) * width] for i in range(len(mask))]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_reinforce_plus_plus_random_against_loops(seed, gamma):
    rewards, groups, mask = _random_batch(seed)
    adv = compute_advantages(_t(rewards), torch.tensor(groups), estimator="reinforce_plus_plus",
                             estimator_args={"gamma": gamma}, completion_mask=_t(mask))  # fmt: skip
    assert_close(adv, _t(reinforce_pp_loops(rewards, mask, gamma)), rtol=1e-9, atol=1e-9)


def gpg_loops(rewards, groups, alpha, f_norm):
    members = _members(groups, rewards)
    rows = sum(len(m) for m in members.values())
    if alpha == "valid":
        flat = sum(len(m) for m in members.values() if len({rewards[i] for i in m}) == 1)
        factor = rows / max(rows - flat, 1)
    else:
        factor = rows / max(sum(1 for m in members.values() for i in m if rewards[i] != 0), 1)
    out = [0.0] * len(rewards)
    for m in members.values():
        if len({rewards[i] for i in m}) == 1:
            continue
        mean = sum(rewards[i] for i in m) / len(m)
        for i in m:
            out[i] = factor * (rewards[i] - mean) / f_norm
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("alpha", "f_norm"), [("valid", 1.0), ("nonzero", 1.0), ("valid", 3.0)])
def test_gpg_random_against_loops(seed, alpha, f_norm):
    rewards, groups, _ = _random_batch(seed)
    adv = compute_advantages(_t(rewards), torch.tensor(groups), estimator="gpg",
                             estimator_args={"alpha": alpha, "f_norm": f_norm})  # fmt: skip
    assert_close(adv, _t(gpg_loops(rewards, groups, alpha, f_norm)), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("estimator", ["gdpo", "grpo_passk", "opo", "reinforce_plus_plus", "gpg"])
def test_skipped_rows_get_zero_and_float32_stays_float32(estimator):
    rewards = torch.tensor([1.0, NAN, 0.0, 1.0, 0.0, NAN], dtype=torch.float32)
    extra = {"function_rewards": {"f": rewards, "g": rewards * 2}} if estimator == "gdpo" else {}
    adv = compute_advantages(rewards, torch.tensor([0, 0, 0, 1, 1, 1]), estimator=estimator,
                             completion_mask=torch.ones(6, 3), **extra)  # fmt: skip
    assert adv.dtype == torch.float32
    assert bool((adv[[1, 5]] == 0).all())
    assert bool(torch.isfinite(adv).all())


# ---------------------------------------------------------------- needs and bad input


def test_declared_needs():
    assert estimator_needs("gdpo").function_rewards and estimator_needs("gdpo").groups
    assert not estimator_needs("reinforce_plus_plus").groups
    for name in ("grpo_passk", "opo", "gpg"):
        needs = estimator_needs(name)
        assert needs.groups and not needs.function_rewards and not needs.step_rewards


def test_gdpo_needs_two_functions():
    r = _t([1.0, 0.0])
    with pytest.raises(ValueError, match=r"two reward functions.*advantage_estimator='grpo'"):
        compute_advantages(r, torch.tensor([0, 0]), estimator="gdpo", function_rewards={"only": r})
    with pytest.raises(ValueError, match="two reward functions"):
        compute_advantages(r, torch.tensor([0, 0]), estimator="gdpo")


def test_gdpo_refuses_none_inside_a_group():
    f1, f2 = _t([1.0, 0.0, 1.0]), _t([1.0, NAN, 0.0])  # f2 skipped row 1 only, f1 scored it
    with pytest.raises(ValueError, match=r"'f2' returned None for some completions of a group.*rows \[1\]"):
        compute_advantages(f1 + f2.nan_to_num(), torch.tensor([0, 0, 0]), estimator="gdpo",
                           function_rewards={"f1": f1, "f2": f2})  # fmt: skip


@pytest.mark.parametrize(
    ("estimator", "args", "match"),
    [
        ("grpo_passk", {"k": 0}, "k=0 must be a positive integer"),
        ("grpo_passk", {"k": 1.5}, "k=1.5 must be a positive integer"),
        ("reinforce_plus_plus", {"gamma": 1.5}, r"gamma=1.5 must be a number in \[0, 1\]"),
        ("gpg", {"f_norm": 0.0}, "f_norm=0.0 must be a positive number"),
        ("gpg", {"alpha": "mean"}, "alpha='mean' is not valid; choose one of 'valid'"),
        ("opo", {"k": 2}, "takes no settings"),
    ],
)
def test_bad_settings(estimator, args, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(_t([1.0, 0.0]), torch.tensor([0, 0]), estimator=estimator, estimator_args=args,
                           completion_mask=torch.ones(2, 2))  # fmt: skip


def test_passk_analytic_refuses_non_binary_rewards():
    with pytest.raises(ValueError, match=r"takes 0/1 rewards.*got a reward 0\.5"):
        compute_advantages(_t([1.0, 0.5]), torch.tensor([0, 0]), estimator="grpo_passk", estimator_args={"k": 2})


@pytest.mark.parametrize("estimator", ["opo", "reinforce_plus_plus"])
def test_mask_required(estimator):
    with pytest.raises(ValueError, match=f"{estimator} needs completion_mask of shape \\(N, T\\)"):
        compute_advantages(_t([1.0, 0.0]), torch.tensor([0, 0]), estimator=estimator)


@pytest.mark.parametrize(
    ("estimator", "args", "match"),
    [
        ("grpo_passk", {"k": 4}, r"advantage_estimator_args=\{'k': 4\}: grpo_passk needs k < num_generations=4"),
        ("grpo_passk", {"k": -1}, r"advantage_estimator_args=\{'k': -1\} is not valid: grpo_passk: k=-1"),
        ("reinforce_plus_plus", {"gamma": -0.1}, r"advantage_estimator_args=\{'gamma': -0.1\} is not valid"),
        ("gpg", {"beta": 1}, "takes no setting 'beta'; its settings: f_norm, alpha"),
    ],
)
def test_config_refuses_bad_estimator_settings_at_construction(estimator, args, match):
    from lightning_grpo import GRPOConfig
    from lightning_grpo.config import AdvantageConfig, SamplingConfig
    from lightning_grpo.settings_checks import SettingError

    with pytest.raises(SettingError, match=match):
        GRPOConfig(
            sampling=SamplingConfig(num_generations=4),
            advantages=AdvantageConfig(advantage_estimator=estimator, advantage_estimator_args=args),
        )
    GRPOConfig(
        sampling=SamplingConfig(num_generations=4), advantages=AdvantageConfig(advantage_estimator=estimator)
    )  # the defaults are fine


def test_gdpo_metrics_worked_example():
    # The batch of test_gdpo_worked_example. |weighted normalised| summed per function:
    #   f1: g0 2/sqrt3 + 1/sqrt3 + 1/sqrt3 = 4/sqrt3, g1 1/sqrt2 + 1/sqrt2 = sqrt2  -> 2.3094 + 1.4142 = 3.7236
    #   f2 (weight 2): g0 2 * 4/sqrt3 = 8/sqrt3 = 4.6188, g1 constant 0         -> 4.6188
    # shares 3.7236 / 8.3424 = 0.44634 and 0.55366; f2 is constant in 1 of its 2 groups, f1 in none
    from lightning_grpo.algorithms.advantage_estimators import gdpo_metrics
    from lightning_grpo.algorithms.advantages import AdvantageSettings, group_stats

    f1, f2 = _t([1.0, 0, 0, 2, 0]), _t([0.0, 1, 1, 1, 1])
    stats = group_stats(f1 + 2 * f2, torch.tensor([0, 0, 0, 1, 1]))
    settings = AdvantageSettings(function_rewards={"f1": f1, "f2": f2}, function_weights={"f1": 1.0, "f2": 2.0})
    metrics = gdpo_metrics(stats, settings)
    f1_size, f2_size = 4 / math.sqrt(3) + math.sqrt(2), 8 / math.sqrt(3)
    assert float(metrics["gdpo/f1/share"]) == pytest.approx(f1_size / (f1_size + f2_size), rel=1e-5)
    assert float(metrics["gdpo/f2/share"]) == pytest.approx(f2_size / (f1_size + f2_size), rel=1e-5)
    assert float(metrics["gdpo/f1/zero_std_frac"]) == 0.0
    assert float(metrics["gdpo/f2/zero_std_frac"]) == pytest.approx(0.5)
