"""Policy losses without PPO's hard token clip: ``sapo``, ``gmpo`` and ``gpg`` (docs/math.md, "Policy loss").

* ``sapo`` — Soft Adaptive Policy Optimization (Gao et al., Qwen, 2025, arXiv:2511.20347): the ratio enters through
  a sigmoid gate ``f(r) = 4/τ · σ(τ(r - 1))`` with ``τ = tau_pos`` for ``A > 0`` and ``tau_neg`` otherwise.
* ``gmpo`` — Geometric-Mean Policy Optimization (Zhao et al., 2025, arXiv:2507.20673): the sign-aware clipped token
  log-ratios are averaged per sequence in log space; the sequence's loss ``-A · exp(mean)`` is written on each of its
  tokens, so ``loss_agg_mode="seq-mean-token-mean"`` gives the paper's mean over sequences.
* ``gpg`` — Group Policy Gradient (Chu et al., 2025, arXiv:2504.02546): ``-A · log π``, no ratio and no clip.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms.policy_loss_terms import (
    PolicyLossSettings,
    PolicyLossTerms,
    log_ratio,
    with_settings_check,
)
from lightning_grpo.settings_checks import check_choice, check_number

__all__: list[str] = []  # the losses are reached through POLICY_LOSSES


def _check_sapo(*, tau_pos: float = 1.0, tau_neg: float = 1.05, **_: object) -> None:
    check_number("tau_pos", tau_pos, minimum=0.0, exclusive_minimum=True)
    check_number("tau_neg", tau_neg, minimum=0.0, exclusive_minimum=True)


@with_settings_check(_check_sapo)
def sapo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> PolicyLossTerms:
    """SAPO's soft gate; the metric ``sapo_gate_mean`` is the mean gradient weight ``4σ(1-σ)`` (1 on-policy)."""
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))  # (N, T)
    tau = torch.where(advantages > 0, advantages.new_tensor(tau_pos), advantages.new_tensor(tau_neg))
    sig = torch.sigmoid(tau * (ratio - 1.0))  # (N, T)
    loss = -advantages * sig * (4.0 / tau)
    weight = (4.0 * sig * (1.0 - sig)).detach()  # d f / d r: the factor on the ratio's gradient
    return PolicyLossTerms(loss, ratio, metrics={"sapo_gate_mean": weight})


def _check_gmpo(
    *, log_clip_low: float = 0.4, log_clip_high: float = 0.4, rows: str = "with_tokens", **_: object
) -> None:
    check_number("log_clip_low", log_clip_low, minimum=0.0)
    check_number("log_clip_high", log_clip_high, minimum=0.0)
    check_choice("rows", rows, ("with_tokens", "all"))


@with_settings_check(_check_gmpo)
def gmpo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    log_clip_low: float = 0.4,
    log_clip_high: float = 0.4,
    rows: Literal["with_tokens", "all"] = "with_tokens",
) -> PolicyLossTerms:
    """GMPO: ``-A_i · exp(mean_t sgn(A)·min(sgn(A)·ρ_t, sgn(A)·clip(ρ_t, -ε_low, ε_high)))``, ρ the log-ratio.

    Per-token advantages are averaged over the sequence's valid tokens (verl's ``geo_mean``); the sign is the
    token's. ``gmpo_seq_ratio_mean`` is the mean geometric-mean ratio, each sequence weighted by its tokens.
    ``rows`` is the rows the ``seq-mean-*`` aggregations count: ``"with_tokens"`` (as every aggregation here) or
    ``"all"`` (verl's ``geo_mean``: fully masked rows too); the objective applies it
    (:mod:`~lightning_grpo.algorithms.peer_normalisers`).
    """
    valid = mask.bool()
    rho = log_ratio(logprobs, old_logprobs)  # (N, T)
    adv = advantages.expand_as(rho)
    sign = torch.sign(adv)
    bounded = rho.clamp(-log_clip_low, log_clip_high)
    clipped = sign * bounded < sign * rho  # the clipped branch is the smaller one: taken
    chosen = torch.where(valid, torch.where(clipped, bounded, rho), torch.zeros_like(rho))
    lengths = valid.sum(-1, keepdim=True).clamp(min=1)
    seq_ratio = torch.exp(chosen.sum(-1, keepdim=True) / lengths)  # (N, 1)
    seq_adv = torch.where(valid, adv, torch.zeros_like(adv)).sum(-1, keepdim=True) / lengths  # (N, 1)
    loss = (-seq_adv * seq_ratio).expand_as(rho)
    metrics = {"gmpo_seq_ratio_mean": seq_ratio.detach().expand_as(rho)}
    return PolicyLossTerms(loss, torch.exp(rho), clipped & valid, metrics=metrics)


def gpg(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, settings: PolicyLossSettings
) -> PolicyLossTerms:
    """GPG's loss: ``-A · log π`` (the REINFORCE gradient, whatever ``old_logprobs``); no clip, no settings."""
    ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()  # only for the diagnostics
    return PolicyLossTerms(-advantages * logprobs, ratio)
