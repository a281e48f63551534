"""Entropy-preserving losses of Cui et al. 2025: ``clip_cov`` and ``kl_cov`` (docs/math.md, "Policy loss").

"The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (arXiv:2505.22617): the entropy
falls with the covariance of a token's log-prob and its advantage, so the tokens of largest covariance

    Cov_t = (A_t - mean(A)) · (log π_t - mean(log π)),   means over the valid tokens of the micro-batch

are held back: ``clip_cov`` removes the gradient of ``clip_cov_ratio`` of the valid tokens chosen at random among
those with ``clip_cov_lb < Cov_t < clip_cov_ub`` (not already clipped by PPO's clip); ``kl_cov`` adds
``ppo_kl_coef · |log π - log π_old|`` to the ``kl_cov_ratio`` of the valid tokens of largest ``Cov_t`` (the
unclipped surrogate ``-A·r`` elsewhere).

The statistic and the choice are per micro-batch (verl's behaviour): splitting a mini-batch into other micro-batches
or ranks chooses other tokens, so unlike the other losses these two are not micro-batch invariant. Random choices
use the step's seed (``PolicyLossSettings.seed``).
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
from lightning_grpo.algorithms.statistics import masked_mean
from lightning_grpo.settings_checks import check_number

__all__: list[str] = []  # the losses are reached through POLICY_LOSSES


def _covariance(logprobs: Tensor, advantages: Tensor, valid: Tensor) -> Tensor:
    """``(A - mean A)(log π - mean log π)`` per token, detached; ``-inf`` on padding."""
    lp, adv = logprobs.detach(), advantages.detach().expand_as(logprobs)
    cov = (adv - masked_mean(adv, valid)) * (lp - masked_mean(lp, valid))
    return torch.where(valid, cov, torch.full_like(cov, float("-inf")))


def _count(fraction: float, valid: Tensor) -> int:
    """``max(1, int(fraction · valid tokens))``, as verl (one host sync)."""
    return max(int(fraction * int(valid.sum())), 1)


def _check_clip_cov(*, clip_cov_ratio: float, clip_cov_lb: float, clip_cov_ub: float, **_: object) -> None:
    check_number(
        "clip_cov_ratio", clip_cov_ratio, minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True
    )
    check_number("clip_cov_lb", clip_cov_lb)
    check_number("clip_cov_ub", clip_cov_ub, minimum=clip_cov_lb, exclusive_minimum=True)


@with_settings_check(_check_clip_cov)
def clip_cov(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> PolicyLossTerms:
    """PPO's clipped surrogate with the gradient of the chosen band tokens removed (``cov_selected_frac``)."""
    valid = mask.bool()
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))  # (N, T)
    unclipped = -advantages * ratio
    bounded = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = (bounded > unclipped) & valid
    loss = torch.maximum(unclipped, bounded)
    cov = _covariance(logprobs, advantages, valid)
    band = valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    candidates = band.flatten().nonzero().squeeze(-1)  # (K,)
    generator = settings.generator(torch.device("cpu"))
    order = torch.randperm(candidates.numel(), generator=generator, device="cpu").to(candidates.device)
    chosen = candidates[order[: _count(clip_cov_ratio, valid)]]
    selected = torch.zeros_like(valid).flatten().index_fill(0, chosen, True).view_as(valid)
    loss = torch.where(selected, loss.detach(), loss)
    return PolicyLossTerms(loss, ratio, clipped, metrics={"cov_selected_frac": selected.float()})


def _check_kl_cov(*, kl_cov_ratio: float, ppo_kl_coef: float, **_: object) -> None:
    check_number("kl_cov_ratio", kl_cov_ratio, minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True)
    check_number("ppo_kl_coef", ppo_kl_coef, minimum=0.0)


@with_settings_check(_check_kl_cov)
def kl_cov(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
) -> PolicyLossTerms:
    """``-A·r`` plus ``ppo_kl_coef·|log r|`` on the top ``kl_cov_ratio`` covariance tokens (``cov_selected_frac``)."""
    valid = mask.bool()
    rho = log_ratio(logprobs, old_logprobs)
    ratio = torch.exp(rho)  # (N, T)
    selected = torch.zeros_like(valid)
    if valid.any():
        top = _covariance(logprobs, advantages, valid).flatten().topk(_count(kl_cov_ratio, valid)).indices
        selected = selected.flatten().index_fill(0, top, True).view_as(valid)
    loss = -advantages * ratio + torch.where(selected, ppo_kl_coef * rho.abs(), torch.zeros_like(rho))
    return PolicyLossTerms(loss, ratio, metrics={"cov_selected_frac": selected.float()})
