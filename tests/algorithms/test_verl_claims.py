"""Every "same as verl" claim of docs/math.md and docs/coming-from.md, checked against verl 0.9.1's own functions.

Each test calls verl's function (``verl.trainer.ppo.core_algos``, ``verl.trainer.ppo.rollout_corr_helper``) and ours
on the same float64 inputs with uneven masks (a fully masked row included where verl produces one), and pins either
the equality the docs state or the exact difference they state. verl is installed with ``--no-deps`` (``make
verl``); without it these tests are skipped.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.algorithms.policy_losses import policy_loss
from lightning_grpo.algorithms.rollout_correction import rejection_keep, rollout_correct

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
rollout_corr_helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
actor_config = pytest.importorskip("verl.workers.config.actor")

LENGTHS = [7, 3, 0, 5, 1, 7, 4, 6]  # row 2 fully masked (verl's rejection produces such rows)
T = 7


def _mask(lengths: list[int] = LENGTHS) -> torch.Tensor:
    return (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).double()


def _logprobs(seed: int, spread: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(LENGTHS), T, generator=generator, dtype=torch.float64) * 2
    current = old + spread * torch.randn(len(LENGTHS), T, generator=generator, dtype=torch.float64)
    return current, old


def _verl_actor(**policy_loss_args: float) -> types.SimpleNamespace:
    """What verl's policy losses read of an ``ActorConfig``, its ``policy_loss`` a real ``PolicyLossConfig``."""
    return types.SimpleNamespace(
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, global_batch_info={},
        policy_loss=actor_config.PolicyLossConfig(**policy_loss_args),
    )  # fmt: skip


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return core_algos.agg_loss(per_token, mask, "token-mean")


def _seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Our ``seq-mean-token-mean``: per-row token means, averaged over the rows with tokens."""
    rows = mask.sum(-1)
    return ((per_token * mask).sum(-1) / rows.clamp(min=1)).sum() / (rows > 0).sum()


# ---------------------------------------------------------------- claim 1: gmpo vs geo_mean


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_is_verl_geo_mean_times_rows_over_rows_with_tokens(seed):
    """verl's ``geo_mean`` averages over every row, a fully masked one included; ours over rows with tokens."""
    current, old = _logprobs(seed)
    mask = _mask()
    advantages = torch.randn(len(LENGTHS), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    theirs, _ = core_algos.compute_policy_loss_geo_mean(
        old, current, advantages[:, None].expand(-1, T) * mask, mask, config=_verl_actor()
    )
    per_token, _ = policy_loss(
        current, old, advantages, mask, kind="gmpo", kind_args={"log_clip_low": 0.2, "log_clip_high": 0.2}
    )
    ours = _seq_mean_token_mean(per_token, mask)
    rows, rows_with_tokens = len(LENGTHS), sum(n > 0 for n in LENGTHS)
    torch.testing.assert_close(ours, theirs * rows / rows_with_tokens, rtol=1e-7, atol=1e-12)  # verl: len + 1e-8
    assert abs(float(ours - theirs)) > 1e-3  # the difference is real
    full = mask.sum(-1) > 0  # without the empty row the two agree exactly
    their_full, _ = core_algos.compute_policy_loss_geo_mean(
        old[full], current[full], (advantages[:, None] * mask)[full], mask[full], config=_verl_actor()
    )
    torch.testing.assert_close(ours, their_full, rtol=1e-7, atol=1e-12)


# ---------------------------------------------------------------- claim 2: kl_cov's ppo_kl_coef


def test_kl_cov_defaults_differ_from_verls_config_in_ppo_kl_coef():
    """verl 0.9.1's ``PolicyLossConfig`` defaults ``ppo_kl_coef`` to 0.1; ours (the authors' code) is 1.0."""
    defaults = actor_config.PolicyLossConfig()
    assert (defaults.kl_cov_ratio, defaults.ppo_kl_coef) == (2e-4, 0.1)
    current, old = _logprobs(3)
    mask = _mask()
    advantages = torch.randn(len(LENGTHS), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for coef in (0.1, 1.0):
        args = {"kl_cov_ratio": 0.05, "ppo_kl_coef": coef}
        theirs, _ = core_algos.compute_policy_loss_kl_cov(
            old, current, advantages[:, None] * mask, mask, "token-mean", config=_verl_actor(**args)
        )
        per_token, _ = policy_loss(current, old, advantages, mask, kind="kl_cov", kind_args=args)
        torch.testing.assert_close(_token_mean(per_token, mask), theirs, rtol=1e-10, atol=1e-12)
    default, _ = policy_loss(current, old, advantages, mask, kind="kl_cov", kind_args={"kl_cov_ratio": 0.05})
    verl_default, _ = core_algos.compute_policy_loss_kl_cov(
        old, current, advantages[:, None] * mask, mask, "token-mean",
        config=_verl_actor(kl_cov_ratio=0.05),
    )  # fmt: skip
    assert abs(float(_token_mean(default, mask) - verl_default)) > 1e-4  # 1.0 vs verl's 0.1


# ---------------------------------------------------------------- claim 3: gdpo's whitening


def _verl_gdpo(per_function: torch.Tensor, weights: list[float], mask: torch.Tensor, groups: torch.Tensor):
    keys = [f"f{k}" for k in range(per_function.shape[1])]
    prompt = torch.ones(len(mask), 2, dtype=torch.long)
    batch = {"prompts": prompt, "attention_mask": torch.cat([prompt, mask.long()], 1)}
    scores = {key: per_function[:, k].numpy() for k, key in enumerate(keys)}
    config = {"gdpo_reward_keys": keys, "gdpo_reward_weights": weights}
    advantages, _ = core_algos.compute_gdpo_outcome_advantage(
        torch.zeros_like(mask, dtype=torch.float32), mask.float(), np.asarray(groups), config=config,
        non_tensor_batch=scores, batch=batch,
    )  # fmt: skip
    return advantages.double()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gdpo_whiten_tokens_equals_verl_and_rows_differs(seed):
    """``gdpo`` with ``whiten: tokens`` is verl's ``adv_estimator=gdpo`` (``masked_whiten`` over the tokens)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [7, 2, 5, 1, 6, 3, 7, 4]
    mask = _mask(lengths)
    per_function = torch.randint(0, 3, (8, 2), generator=generator).double()
    weights, groups = [1.0, 0.5], torch.arange(2).repeat_interleave(4)
    theirs = _verl_gdpo(per_function, weights, mask, groups)
    functions = {"f0": per_function[:, 0], "f1": per_function[:, 1]}
    common = {
        "estimator": "gdpo", "completion_mask": mask, "function_rewards": functions,
        "function_weights": dict(zip(functions, weights, strict=True)),
    }  # fmt: skip
    rewards = per_function @ torch.tensor(weights, dtype=torch.float64)
    tokens = compute_advantages(rewards, groups, estimator_args={"whiten": "tokens"}, **common)
    torch.testing.assert_close(tokens[:, None] * mask, theirs, rtol=1e-5, atol=1e-5)  # verl sums in float32
    rows = compute_advantages(rewards, groups, **common)
    assert float((rows - tokens).abs().max()) > 1e-2  # the default (rows, the paper's and TRL's) is not verl's


def test_gdpo_rejects_an_unknown_whitening():
    with pytest.raises(ValueError, match="whiten='batch' is not valid; choose one of 'rows'"):
        compute_advantages(torch.zeros(4), torch.zeros(4, dtype=torch.long), estimator="gdpo",
                           estimator_args={"whiten": "batch"})  # fmt: skip


# ---------------------------------------------------------------- claims 4 and 5: rejection


def _verl_rejection(current: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, low: float, high: float):
    """verl's ``seq_mean_k1`` with ``rollout_rs_threshold="low_high"``: the response mask without rejected rows."""
    kept, _ = rollout_corr_helper.compute_rollout_rejection_mask(
        current - behaviour, mask, rollout_rs="seq_mean_k1", rollout_rs_threshold=f"{low}_{high}"
    )
    return kept * mask


@pytest.mark.parametrize(("low", "high"), [(0.8, 1.05), (0.95, 1.5), (0.9, 1.1)])
def test_rejection_bounds_map_to_verls_inverted(low, high):
    """verl bounds ``π_rollout/π_old``, the inverse of our statistic: verl's ``low_high`` is our ``[1/high, 1/low]``."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, T + 1, (72,), generator=generator)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    old = -torch.rand(72, T, generator=generator, dtype=torch.float64)
    behaviour = old + 0.15 * torch.randn(72, T, generator=generator, dtype=torch.float64)
    theirs = _verl_rejection(old, behaviour, mask, low, high).amax(-1)  # 1 where the row is kept
    ours = rejection_keep(old, behaviour, mask, "geometric", 1 / high, 1 / low).squeeze(-1)
    assert ours.tolist() == theirs.tolist() and 0 < ours.sum() < 72
    naive = rejection_keep(old, behaviour, mask, "geometric", low, high).squeeze(-1)  # the old, wrong mapping
    if not math.isclose(low * high, 1.0):
        assert naive.tolist() != theirs.tolist()


def test_rejection_keeps_rejected_tokens_in_the_token_mean_normaliser():
    """verl drops rejected tokens from ``response_mask`` (and the normaliser); ours keeps them counted:
    ours = verl × kept tokens / all tokens."""
    _, old = _logprobs(5)
    behaviour = old + 0.2 * torch.randn(old.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    mask = _mask()
    per_token = torch.randn(old.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    kept_mask = _verl_rejection(old, behaviour, mask, 0.9, 1.1)
    theirs = _token_mean(per_token, kept_mask)
    weighted, _ = rollout_correct(per_token, old, behaviour, mask, (None, None, None), ("geometric", 1 / 1.1, 1 / 0.9))
    ours = _token_mean(weighted, mask)
    assert 0 < kept_mask.sum() < mask.sum()
    torch.testing.assert_close(ours, theirs * kept_mask.sum() / mask.sum(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- claim 8: reinforce_plus_plus across masked tokens


def test_reinforce_plus_plus_carries_the_return_across_masked_tokens_as_verl():
    """verl 0.9.1 carries the running return through masked (tool) tokens undiscounted; so do we."""
    mask = _mask([7, 5, 6, 3]).clone()
    mask[0, 2:4] = 0  # a tool's tokens inside the completion
    mask[2, 1] = 0
    rewards = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
    last = (mask * torch.arange(T)).argmax(-1)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(4), last] = rewards
    theirs, returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        token_rewards, mask, config=types.SimpleNamespace(gamma=0.9)
    )
    assert float(returns[0, 1]) == pytest.approx(0.9**3)  # three policy tokens after it, the tool's skipped
    ours = compute_advantages(rewards, torch.arange(4), estimator="reinforce_plus_plus",
                              estimator_args={"gamma": 0.9}, completion_mask=mask)  # fmt: skip
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-6, atol=1e-6)  # verl: rsqrt(var + 1e-8)
