"""Every error raised by the public functions of ``lightning_grpo.algorithms``.

Unknown names raise ``ValueError`` listing every valid name; shape errors show the shapes involved.
"""

import re

import pytest
import torch

from lightning_grpo import GRPOConfig
from lightning_grpo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    compute_advantages,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    selective_logprobs,
)
from lightning_grpo.config import ObjectiveConfig

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 1, 1])
LP = torch.zeros(2, 3)
MASK = torch.ones(2, 3)
ADV = torch.tensor([1.0, -1.0])


def _lists(what, bad, names):
    """Regex for ``unknown <what> '<bad>'; valid names: 'a', 'b', ...`` (every valid name, in catalogue order)."""
    return re.escape(f"unknown {what} {bad!r}; valid names: " + ", ".join(repr(n) for n in names))


# --- unknown names ----------------------------------------------------------------------------------------------


def test_unknown_advantage_estimator():
    assert list(ADVANTAGE_ESTIMATORS) == [
        "grpo", "rloo", "reinforce_pp_baseline", "grpo_process", "gdpo", "grpo_passk", "opo", "reinforce_plus_plus",
        "gpg",
    ]  # fmt: skip
    with pytest.raises(ValueError, match=_lists("advantage estimator", "ppo", ADVANTAGE_ESTIMATORS)):
        compute_advantages(REWARDS, GROUPS, estimator="ppo")


def test_unknown_advantage_scale():
    with pytest.raises(ValueError, match=_lists("advantage scale", "std", ["group", "batch", "none"])):
        compute_advantages(REWARDS, GROUPS, scale="std")


def test_unknown_policy_loss_kind():
    assert list(POLICY_LOSSES) == [
        "clip", "gspo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "gpg"
    ]  # fmt: skip
    with pytest.raises(ValueError, match=_lists("policy loss kind", "ppo", POLICY_LOSSES)):
        policy_loss(LP, LP, ADV, MASK, kind="ppo")


@pytest.mark.parametrize("bad", ["k4", "K3", "k3++", "low-var-kl"])
def test_unknown_kl_estimator(bad):
    names = ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]
    assert list(KL_ESTIMATORS) == names + [f"{n}+" for n in names]
    with pytest.raises(ValueError, match=_lists("KL estimator", bad, KL_ESTIMATORS)):
        kl_penalty(LP, LP, bad)


def test_unknown_aggregation_mode():
    modes = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    assert list(LOSS_AGG_MODES) == modes
    with pytest.raises(ValueError, match=_lists("loss aggregation mode", "mean", modes)):
        aggregate_loss(LP, MASK, "mean")


def test_unhashable_name_is_a_value_error():
    # a list is not a name: still the same listing ValueError, not a TypeError from the dict look-up
    with pytest.raises(ValueError, match="valid names: 'token-mean'"):
        aggregate_loss(LP, MASK, ["token-mean"])


# --- compute_advantages -----------------------------------------------------------------------------------------


def test_advantages_shape_mismatch():
    with pytest.raises(ValueError, match=re.escape("got rewards (4,), group_ids (3,)")):
        compute_advantages(REWARDS, torch.tensor([0, 0, 1]))


def test_advantages_rewards_not_1d():
    with pytest.raises(ValueError, match=re.escape("got rewards (2, 2), group_ids (2, 2)")):
        compute_advantages(REWARDS.view(2, 2), GROUPS.view(2, 2))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_advantages_non_float_rewards(dtype):
    with pytest.raises(TypeError, match=re.escape(f"rewards must be a floating-point tensor, got dtype {dtype}")):
        compute_advantages(REWARDS.to(dtype), GROUPS)


def test_reinforce_pp_baseline_needs_completion_mask():
    with pytest.raises(ValueError, match=re.escape("needs completion_mask of shape (N, T) with N=4; got None")):
        compute_advantages(REWARDS, GROUPS, estimator="reinforce_pp_baseline")


@pytest.mark.parametrize("shape", [(3, 2), (4,), (5, 2)])
def test_reinforce_pp_baseline_completion_mask_shape(shape):
    with pytest.raises(ValueError, match=re.escape(f"with N=4; got {shape}")):
        compute_advantages(REWARDS, GROUPS, estimator="reinforce_pp_baseline", completion_mask=torch.ones(shape))


# --- policy_loss ------------------------------------------------------------------------------------------------


def test_policy_loss_logprobs_shape_mismatch():
    expected = "logprobs (2, 3), old_logprobs (2, 2), completion_mask (2, 3)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        policy_loss(LP, torch.zeros(2, 2), ADV, MASK)


def test_policy_loss_mask_shape_mismatch():
    expected = "logprobs (2, 3), old_logprobs (2, 3), completion_mask (3, 3)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        policy_loss(LP, LP, ADV, torch.ones(3, 3))


@pytest.mark.parametrize("shape", [(3,), (2, 2), (2, 3, 1), (1, 3)])
def test_policy_loss_advantages_shape(shape):
    expected = f"advantages must be (N,) or (N, T) matching logprobs (2, 3); got {shape}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        policy_loss(LP, LP, torch.zeros(shape), MASK)


@pytest.mark.parametrize(("clip_low", "clip_high"), [(1.0, 0.2), (1.5, 0.2), (-0.1, 0.2), (0.2, -0.1)])
@pytest.mark.parametrize("kind", list(POLICY_LOSSES))
def test_policy_loss_invalid_clip_range(kind, clip_low, clip_high):
    if clip_high < 0:
        expected = f"clip_high must be a finite number >= 0.0, got {clip_high}"
    else:
        expected = f"clip_low must be a finite number in [0.0, 1.0), got {clip_low}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        policy_loss(LP, LP, ADV, MASK, kind=kind, clip_low=clip_low, clip_high=clip_high)


@pytest.mark.parametrize("dual_clip", [1.0, 0.5, 0.0, -3.0])
def test_policy_loss_invalid_dual_clip(dual_clip):
    # the dual clip bound -A c must lie above the clipped surrogate: c > 1
    with pytest.raises(
        ValueError, match=re.escape(f"dual_clip must be a finite number > 1.0 or None, got {dual_clip}")
    ):
        policy_loss(LP, LP, ADV, MASK, dual_clip=dual_clip)


@pytest.mark.parametrize(("delta", "clip_high"), [(1.2, 0.2), (1.1, 0.2), (1.25, 0.28), (0.5, 0.2)])
def test_policy_loss_invalid_delta(delta, clip_high):
    # delta bounds the unclipped ratio and must exceed the upper clip bound 1 + clip_high
    expected = f"delta must be a finite number > {1.0 + clip_high} or None, got {delta}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        policy_loss(LP, LP, ADV, MASK, clip_high=clip_high, delta=delta)


def test_config_refuses_clip_settings_with_the_loss_message():
    # GRPOConfig calls the loss's own check: one rule, one message, at construction
    with pytest.raises(ValueError, match=re.escape("delta must be a finite number > 1.2 or None, got 1.1")):
        GRPOConfig(objective=ObjectiveConfig(delta=1.1))
    with pytest.raises(TypeError, match=re.escape("clip_low must be a finite number in [0.0, 1.0), got '0.2' (str)")):
        GRPOConfig(objective=ObjectiveConfig(clip_low="0.2"))


def test_policy_loss_valid_edge_settings_accepted():
    # the boundaries of the valid ranges: clip_low 0, clip_high 0, dual clip just above 1, delta just above 1.2
    policy_loss(LP, LP, ADV, MASK, clip_low=0.0, clip_high=0.0)
    policy_loss(LP, LP, ADV, MASK, dual_clip=1.01, delta=1.21)


# --- kl_penalty -------------------------------------------------------------------------------------------------


def test_kl_shape_mismatch():
    with pytest.raises(ValueError, match=re.escape("logprobs (2, 3), ref_logprobs (3, 2)")):
        kl_penalty(LP, torch.zeros(3, 2))


# --- aggregate_loss ---------------------------------------------------------------------------------------------


def test_aggregate_shape_mismatch():
    with pytest.raises(ValueError, match=re.escape("values (2, 3), completion_mask (2, 4)")):
        aggregate_loss(LP, torch.ones(2, 4))


@pytest.mark.parametrize("norm", [0, 0.0, -1.0])
def test_aggregate_non_positive_norm(norm):
    with pytest.raises(ValueError, match=re.escape(f"norm must be positive, got {norm}")):
        aggregate_loss(LP, MASK, "seq-mean-token-sum-norm", norm=norm)


# --- selective_logprobs / entropy_from_logits ------------------------------------------------------------------

LOGITS = torch.zeros(2, 3, 5)
IDS = torch.zeros(2, 3, dtype=torch.long)


def _both(**kwargs):
    """Call both kernels with the same keyword arguments (they share their checks)."""
    return [lambda: selective_logprobs(LOGITS, IDS, **kwargs), lambda: entropy_from_logits(LOGITS, **kwargs)]


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_non_positive_temperature(temperature):
    for call in _both(temperature=temperature):
        with pytest.raises(ValueError, match=re.escape(f"temperature must be > 0, got {temperature}")):
            call()


@pytest.mark.parametrize("chunk_size", [0, -4])
def test_bad_chunk_size(chunk_size):
    for call in _both(chunk_size=chunk_size):
        with pytest.raises(ValueError, match=re.escape(f"chunk_size must be >= 1, got {chunk_size}")):
            call()


@pytest.mark.parametrize("shape", [(2, 2), (3, 2), (6,), (2, 3, 1)])
def test_token_ids_shape_mismatch(shape):
    expected = f"token_ids shape {shape} must equal logits shape without the vocabulary dimension (2, 3)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        selective_logprobs(LOGITS, torch.zeros(shape, dtype=torch.long))


def test_logits_need_a_vocabulary_dimension():
    with pytest.raises(ValueError, match=re.escape("logits must be (..., V); got shape (5,)")):
        selective_logprobs(torch.zeros(5), torch.tensor(0))
    with pytest.raises(ValueError, match=re.escape("logits must be (..., V); got shape (5,)")):
        entropy_from_logits(torch.zeros(5))


def test_integer_logits():
    with pytest.raises(TypeError, match=re.escape("logits must be floating point, got dtype torch.int64")):
        selective_logprobs(LOGITS.long(), IDS)
    with pytest.raises(TypeError, match=re.escape("logits must be floating point, got dtype torch.int64")):
        entropy_from_logits(LOGITS.long())
