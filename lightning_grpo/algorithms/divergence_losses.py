"""DPPO's binary trust region: ``dppo_tv`` and ``dppo_kl`` (docs/math.md, "Policy loss").

Divergence Proximal Policy Optimization ("Rethinking the Trust Region in LLM Reinforcement Learning",
arXiv:2602.04879; code: sail-sg/Stable-RL). Instead of clipping the ratio, a token's update is masked when the
sampled token's probability has moved, in the direction its advantage pushes it, by more than a threshold of a
divergence between ``Bernoulli(p_old)`` and ``Bernoulli(p)``:

* ``dppo_tv``: the total variation ``|p - p_old|``;
* ``dppo_kl``: the binary KL ``p_old·log(p_old/p) + (1-p_old)·log((1-p_old)/(1-p))``.

The kept tokens get the policy gradient with the importance weight: ``-A · sg(r) · log π`` (whose gradient is
``-A·r·∇log π``, PPO's unclipped one), truncated at ``ratio_cap`` if set (verl's ``clip_ratio_c``; the authors' recipe
turns it off, as their paper finds truncation biased). Defaults are the authors' (verl's ``run_qwen30b_dppo.sh``):
TV 0.15, KL 0.05. The paper anchors ``p_old`` to the sampler's policy: ``GRPOConfig.corrections.old_logprobs="rollout"``
(verl's bypass mode, also with one update per rollout); otherwise ``p_old`` is the loss's recomputed
``old_logprobs``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.algorithms.policy_loss_terms import (
    PolicyLossSettings,
    PolicyLossTerms,
    log_ratio,
    with_settings_check,
)
from lightning_grpo.settings_checks import check_number

__all__: list[str] = []  # the losses are reached through POLICY_LOSSES

_EPS = 1e-8  # inside the binary KL's second log, as verl


def _check(*, threshold_low: float, threshold_high: float, ratio_cap: float | None, **_: object) -> None:
    check_number("threshold_low", threshold_low, minimum=0.0, exclusive_minimum=True)
    check_number("threshold_high", threshold_high, minimum=0.0, exclusive_minimum=True)
    check_number("ratio_cap", ratio_cap, minimum=1.0, allow_none=True)


def _terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    keep: Tensor,
    divergence: Tensor,
    ratio_cap: float | None,
) -> PolicyLossTerms:
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))  # (N, T)
    weight = (ratio if ratio_cap is None else ratio.clamp(max=ratio_cap)).detach()
    capped = torch.zeros_like(keep) if ratio_cap is None else ratio.detach() > ratio_cap
    loss = torch.where(keep, -advantages * weight * logprobs, torch.zeros_like(ratio))
    metrics = {
        "dppo_masked_frac": (~keep).float(),
        "dppo_divergence_mean": divergence,
        "dppo_ratio_capped_frac": capped.float(),
    }
    return PolicyLossTerms(loss, ratio, ~keep, metrics=metrics)


@with_settings_check(_check)
def dppo_tv(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    threshold_low: float = 0.15,
    threshold_high: float = 0.15,
    ratio_cap: float | None = None,
) -> PolicyLossTerms:
    """DPPO-Binary-TV: masked when ``p - p_old > threshold_high`` (``A > 0``) or ``p_old - p > threshold_low``."""
    with torch.no_grad():
        moved = torch.exp(logprobs) - torch.exp(old_logprobs)  # (N, T)
        keep = torch.where(advantages > 0, moved <= threshold_high, moved >= -threshold_low)
    return _terms(logprobs, old_logprobs, advantages, keep, moved.abs(), ratio_cap)


def _binary_kl(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    p, p_old = torch.exp(logprobs), torch.exp(old_logprobs)
    return p_old * (old_logprobs - logprobs) + (1.0 - p_old) * torch.log((1.0 - p_old + _EPS) / (1.0 - p + _EPS))


@with_settings_check(_check)
def dppo_kl(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    threshold_low: float = 0.05,
    threshold_high: float = 0.05,
    ratio_cap: float | None = None,
) -> PolicyLossTerms:
    """DPPO-Binary-KL: masked when the binary KL exceeds the threshold and ``p`` moved the way ``A`` pushes it."""
    with torch.no_grad():
        kl = _binary_kl(logprobs, old_logprobs)  # (N, T)
        up, down = logprobs > old_logprobs, logprobs < old_logprobs
        keep = torch.where(advantages > 0, (kl <= threshold_high) | ~up, (kl <= threshold_low) | ~down)
    return _terms(logprobs, old_logprobs, advantages, keep, kl, ratio_cap)
