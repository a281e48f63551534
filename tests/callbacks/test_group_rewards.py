"""GroupRewardStats: worked examples, the cross-rank reduction, and the values logged in a real fit."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.callbacks import GroupRewardStats
from lightning_grpo.callbacks.group_rewards import group_reward_stats
from lightning_grpo.config import AdvantageConfig
from lightning_grpo.rewards import RewardScores
from tests.callbacks.helpers import fit
from tests.conftest import tiny_sampling

NAN = math.nan


def _scores(rewards: list[float], **per_function: list[float]) -> RewardScores:
    return RewardScores(torch.tensor(rewards), {k: torch.tensor(v) for k, v in per_function.items()})


def test_worked_example_with_skipped_rows():
    # G = 4, three groups:
    #   g0 = [1, 1, 1, 1]        constant                      -> zero variance
    #   g1 = [0, 1, NaN, 1]      valid (0, 1, 1): mean 2/3, unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3
    #   g2 = [NaN, 2, NaN, NaN]  one valid reward              -> zero variance, no variance estimate
    # within_var = mean(0, 1/3) = 1/6 (g2 has no variance); the zero-spread fraction is the module's zero_std_frac.
    # valid rewards (1, 1, 1, 1, 0, 1, 1, 2): mean 1, deviations (0, 0, 0, 0, -1, 0, 0, 1) -> std = sqrt(2 / 7).
    rewards = [1, 1, 1, 1, 0, 1, NAN, 1, NAN, 2, NAN, NAN]
    scores = _scores(rewards, f=rewards, g=[NAN] * 4 + [3, 5, NAN, NAN] + [NAN] * 4, h=[NAN] * 12)
    group_ids = torch.arange(12) // 4
    advantages = torch.tensor([0.0, 0, 0, 0, -2, 1, 0, 1, 0, 0, 0, 0])  # the NaN rows (6, 8, 10, 11) are left out
    stats = group_reward_stats(scores, group_ids, advantages, torch.ones(12, 3))
    expected = {
        "reward_mean": 1.0,
        "reward_std": math.sqrt(2 / 7),
        "group/within_var": 1 / 6,
        "group/adv_mean": 0.0,  # (-2 + 1 + 1) / 8
        "group/adv_std": math.sqrt(6 / 7),  # (4 + 1 + 1) / (8 - 1)
        "reward/f": 1.0,
        "reward/g": 4.0,  # nanmean of (3, 5)
    }
    for name, value in expected.items():
        torch.testing.assert_close(stats[name], torch.tensor(value), msg=name)
    assert math.isnan(stats["reward/h"])  # never applied: no data, NaN rather than a made-up 0
    assert set(stats) == {*expected, "reward/h"}  # one owner per metric: nothing the module already logs


def test_token_level_advantages_use_valid_tokens_of_valid_rows():
    # Row 0: tokens (1, 3) valid, the third is padding; row 1: all three; row 2 is a skipped row.
    # Values counted: 1, 3, 2, 2, 2 -> mean 2, squares of deviations 1 + 1 + 0 + 0 + 0 = 2 -> std sqrt(2 / 4).
    scores = _scores([0.0, 1.0, NAN], f=[0.0, 1.0, NAN])
    advantages = torch.tensor([[1.0, 3.0, 99.0], [2.0, 2.0, 2.0], [50.0, 50.0, 50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    stats = group_reward_stats(scores, torch.tensor([0, 0, 0]), advantages, mask)
    torch.testing.assert_close(stats["group/adv_mean"], torch.tensor(2.0))
    torch.testing.assert_close(stats["group/adv_std"], torch.tensor(math.sqrt(0.5)))


def test_sums_across_ranks_give_the_global_batch_statistics():
    # Two "ranks" with two groups each; reward "g" applies to no row of rank 1: a mean of per-rank means would be NaN.
    rewards = torch.tensor([0.0, 1, 2, 2, 5, NAN, 1, 4])
    g = torch.tensor([1.0, 2, 3, NAN, NAN, NAN, NAN, NAN])
    group_ids, advantages, mask = torch.arange(8) // 2, torch.linspace(-1, 1, 8), torch.ones(8, 2)
    full = group_reward_stats(RewardScores(rewards, {"g": g}), group_ids, advantages, mask)

    def rank(rows: slice, reduce) -> dict[str, torch.Tensor]:
        scores = RewardScores(rewards[rows], {"g": g[rows]})
        return group_reward_stats(scores, group_ids[rows], advantages[rows], mask[rows], reduce)

    sent = {}
    rank(slice(4, 8), lambda sums: sent.setdefault("rank1", sums.clone()))
    on_rank0 = rank(slice(0, 4), lambda sums: sums + sent["rank1"])
    assert on_rank0.keys() == full.keys()
    for name in full:
        torch.testing.assert_close(on_rank0[name], full[name], msg=name)
    torch.testing.assert_close(full["reward/g"], torch.tensor(2.0))


def _constant_first_group(prompts, completions, **_):
    """1.0 for every completion of "1+1=" (a zero-variance group); varied values for "2+2="; row 5 skipped."""
    pairs = zip(prompts, completions, strict=True)
    values = [1.0 if p.startswith("1") else float(ord(c[0]) % 5 if c else 0) for p, c in pairs]
    return [None if i == 5 else value for i, value in enumerate(values)]


def _digit_only_on_second_prompt(prompts, completions, **_):
    """Whether "2+2=" completions hold a digit; skips "1+1=" and row 5, so row 5 has no reward at all."""
    pairs = zip(prompts, completions, strict=True)
    values = [None if p.startswith("1") else float(any(ch.isdigit() for ch in c)) for p, c in pairs]
    return [None if i == 5 else value for i, value in enumerate(values)]


def _by_hand(out: dict) -> dict[str, float]:
    """The statistics from one step's outputs, group by group in plain Python."""
    rewards, ids, adv = out["rewards"].rewards.tolist(), out["rollout"].group_ids.tolist(), out["advantages"]
    groups: dict[int, list[float]] = {}
    for r, g in zip(rewards, ids, strict=True):
        groups.setdefault(g, []).extend([] if math.isnan(r) else [r])
    valid = torch.tensor([r for r in rewards if not math.isnan(r)])
    valid_adv = adv[~torch.isnan(out["rewards"].rewards)]
    spread = [torch.tensor(v).var().item() for v in groups.values() if len(v) >= 2]
    expected = {
        "reward_mean": valid.mean().item(),
        "reward_std": valid.std().item(),
        "zero_std_frac": sum(len(set(v)) <= 1 for v in groups.values()) / len(groups),  # logged by the module
        "group/within_var": sum(spread) / len(spread),
        "group/adv_mean": valid_adv.mean().item(),
        "group/adv_std": valid_adv.std().item(),
    }
    for name, values in out["rewards"].per_function.items():
        expected[f"reward/{name}"] = values.nanmean().item()
    return expected


def test_logged_values_match_a_hand_computation_in_a_fit(make_module):
    module = make_module(
        reward_funcs=(_constant_first_group, _digit_only_on_second_prompt), sampling=tiny_sampling(num_generations=4)
    )
    _, recorder = fit(module, [GroupRewardStats()], iterations=2)
    for out, logged in zip(recorder.outputs, recorder.metrics, strict=True):
        expected = _by_hand(out)
        assert expected["zero_std_frac"] >= 0.5  # the first group is constant by construction
        assert torch.isnan(out["rewards"].rewards[5])  # the skipped row
        for name, value in expected.items():
            torch.testing.assert_close(logged[f"train/{name}"], torch.tensor(value), msg=name)


def test_prefix_and_token_level_advantages_in_a_fit(make_module):
    module = make_module(advantages=AdvantageConfig(advantage_estimator="reinforce_pp_baseline"))
    _, recorder = fit(module, [GroupRewardStats(prefix="rl/")], iterations=1)
    out, logged = recorder.outputs[0], recorder.metrics[0]
    assert out["advantages"].dim() == 2
    tokens = out["advantages"][out["rollout"].completion_mask.bool()]  # every reward is valid here
    torch.testing.assert_close(logged["rl/group/adv_mean"], tokens.mean(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logged["rl/group/adv_std"], tokens.std(), atol=1e-6, rtol=1e-5)
    assert "rl/reward/count_a" in logged


def test_bad_prefix_is_refused():
    with pytest.raises(TypeError, match="prefix must be a string"):
        GroupRewardStats(prefix=None)


def test_outputs_other_than_a_step_output_are_refused():
    with pytest.raises(TypeError, match=r"GroupRewardStats reads the StepOutput .* lack \['rollout', 'rewards'"):
        GroupRewardStats().on_train_batch_end(None, None, {"loss": torch.tensor(0.0)}, {}, 0)
