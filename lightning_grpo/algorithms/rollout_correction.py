"""Rollout correction: importance weights and rejection for a sampler whose log-probs differ from the trainer's.

With ``d_t = log π_old(y_t) - log π_behaviour(y_t)`` over the loss tokens of a sequence (``π_behaviour``: the
sampler, ``Rollout.logprobs``), every piece here is detached and multiplies the per-token policy loss. The
normalisers of the loss aggregation are unchanged: a zero weight or a rejected sequence still counts in them (as
TRL's ``*_mask`` modes do). verl's rejection instead removes the rejected tokens from ``response_mask``, so from the
``token-mean`` normaliser: ours = verl × kept tokens / all tokens (tests/algorithms/test_verl_claims.py);
``rollout_rejection_args: {normalise: kept}`` is verl's (:mod:`~lightning_grpo.algorithms.peer_normalisers`).

**Importance weights** (``GRPOConfig.corrections.rollout_correction``, TRL ``vllm_importance_sampling_mode``; verl
``rollout_is``), bounds ``[C_min, C_max]`` (``rollout_correction_args: {min, max}``; either may be ``None``):

* ``token_truncate``: ``w_t = clip(exp(d_t), C_min, C_max)`` (truncated IS, Yao et al. 2025);
* ``token_mask``: ``w_t = exp(d_t)`` inside the band, 0 outside (IcePop-style masking);
* ``sequence_truncate``: ``w = clip(exp(Σ_t d_t), C_min, C_max)`` on every token of the sequence;
* ``sequence_mask``: ``w = exp(Σ_t d_t)`` inside the band, 0 outside (TRL's default mode).

The log-ratios are clamped to ±20 before ``exp`` (verl's safety bound). The components that apply these from the
settings are in :mod:`~lightning_grpo.algorithms.corrections`.

**Rejection** (``rollout_rejection``; verl ``rollout_rs``): a sequence whose statistic ``s`` is outside
``[min, max]`` (``rollout_rejection_args``) loses its policy loss:

* ``token_mean``: ``s = mean_t exp(d_t)`` (the arithmetic mean of the token ratios);
* ``geometric``: ``s = exp(mean_t d_t)``. verl's ``seq_mean_k1`` bounds the inverse, ``π_rollout/π_old``: its
  ``rollout_rs_threshold="lo_hi"`` is ``[1/hi, 1/lo]`` here.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import masked_mean, sequence_fraction

__all__ = [
    "RolloutCorrection",
    "RolloutRejection",
    "behaviour_logprob_settings",
    "rejection_keep",
    "rollout_correct",
    "rollout_weights",
]

RolloutCorrection = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
RolloutRejection = Literal["token_mean", "geometric"]
_SAFETY = 20.0


def behaviour_logprob_settings(config: object) -> dict[str, object]:
    """The settings of ``config`` (``GRPOConfig.corrections``) that are on and read the sampler's log-probs, by name.

    OPSM is not among them: without the sampler's log-probs it compares with the old ones (TRL's rule).

    Example::

        >>> from types import SimpleNamespace
        >>> behaviour_logprob_settings(SimpleNamespace(rollout_correction="token_mask", rollout_rejection=None))
        {'rollout_correction': 'token_mask'}
    """
    names = ("rollout_correction", "rollout_rejection")
    return {name: getattr(config, name) for name in names if getattr(config, name, None) is not None}


@torch.no_grad()
def rollout_weights(
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    loss_mask: Tensor,
    mode: str,
    low: float | None,
    high: float | None,
) -> Tensor:
    """``(n, T)`` detached importance weights of ``mode`` with bounds ``[low, high]`` (``None``: unbounded).

    Example::

        >>> old, behaviour = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[0.0, -2.0, -1.0]])
        >>> rollout_weights(old, behaviour, torch.ones(1, 3), "token_mask", 0.5, 2.0)  # 1, e (out), e^-1 (out)
        tensor([[1., 0., 0.]])
    """
    mask = loss_mask.bool()
    dtype = torch.promote_types(old_logprobs.dtype, torch.float32)  # float64 stays float64
    d = torch.where(mask, old_logprobs.to(dtype) - behaviour_logprobs.to(dtype), torch.zeros((), device=mask.device))
    level, action = mode.split("_")
    if level == "sequence":
        d = d.sum(-1, keepdim=True).expand_as(d)
    ratio = d.clamp(-_SAFETY, _SAFETY).exp()
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high
    if action == "truncate":
        return ratio.clamp(min=low, max=high)
    return torch.where((ratio >= lo) & (ratio <= hi), ratio, torch.zeros_like(ratio))


@torch.no_grad()
def rejection_keep(
    old_logprobs: Tensor, behaviour_logprobs: Tensor, loss_mask: Tensor, statistic: str, low: float, high: float
) -> Tensor:
    """``(n, 1)`` float: 1 for the sequences whose ``statistic`` lies in ``[low, high]``, 0 for those rejected.

    Example::

        >>> old, behaviour = torch.tensor([[0.0, 0.0], [0.0, -1.0]]), torch.tensor([[0.0, 0.0], [-1.0, 0.0]])
        >>> rejection_keep(old, behaviour, torch.ones(2, 2), "token_mean", 0.9, 1.1)  # 1; (e + e^-1)/2 = 1.54
        tensor([[1.],
                [0.]])
    """
    mask = loss_mask.bool()
    d = (old_logprobs.double() - behaviour_logprobs.double()).clamp(-_SAFETY, _SAFETY)
    count = mask.sum(-1, keepdim=True).clamp(min=1)
    if statistic == "token_mean":
        stat = torch.where(mask, d.exp(), torch.zeros_like(d)).sum(-1, keepdim=True) / count
    elif statistic == "geometric":
        stat = (torch.where(mask, d, torch.zeros_like(d)).sum(-1, keepdim=True) / count).exp()
    else:
        raise ValueError(f"rollout_rejection={statistic!r} is not valid; choose one of 'token_mean', 'geometric'")
    return ((stat >= low) & (stat <= high)).float()


def rollout_correct(
    per_token: Tensor,
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor | None,
    loss_mask: Tensor,
    correction: tuple[str | None, float | None, float | None],
    rejection: tuple[str | None, float, float],
) -> tuple[Tensor, dict[str, Tensor]]:
    """The ``(n, T)`` policy loss weighted and filtered as ``correction`` and ``rejection`` say, and its metrics.

    Args:
        per_token: ``(n, T)`` per-token policy loss.
        old_logprobs: ``(n, T)`` log-probs before the update.
        behaviour_logprobs: ``(n, T)`` log-probs the sampler recorded.
        loss_mask: ``(n, T)`` loss tokens.
        correction: ``(mode, C_min, C_max)``; mode ``None``: no weights.
        rejection: ``(statistic, low, high)``; statistic ``None``: no rejection.

    Returns:
        The loss and ``rollout_is_weight_mean``/``_max``/``_min`` (over the loss tokens, after truncation or
        masking), ``rollout_is_masked_frac`` and ``rollout_is_masked_seq_frac`` (``*_mask`` modes: the share of loss
        tokens whose weight is 0, and of sequences with such a token), ``rollout_rs_rejected_frac`` and
        ``rollout_rs_rejected_seq_frac`` (the share of loss tokens in rejected sequences, and of sequences rejected).
        The ``*_seq_frac`` values are ``[count, sequences]`` pairs (``MetricSums`` sums both over micro-batches and
        ranks).
    """
    (mode, low, high), (statistic, rs_low, rs_high) = correction, rejection
    if mode is None and statistic is None:
        return per_token, {}
    if behaviour_logprobs is None:
        raise ValueError(
            "rollout_correction / rollout_rejection need the sampled log-probs (Rollout.logprobs), but this rollout "
            "has none: fill Rollout.logprobs in your generate override, or set both to null"
        )
    old, behaviour, mask = old_logprobs.detach(), behaviour_logprobs.to(per_token.device), loss_mask.bool()
    metrics: dict[str, Tensor] = {}
    if mode is not None:
        weights = rollout_weights(old, behaviour, loss_mask, mode, low, high)
        per_token = per_token * weights
        metrics["rollout_is_weight_mean"] = masked_mean(weights, mask)
        metrics["rollout_is_weight_max"] = torch.where(mask, weights, torch.zeros_like(weights)).amax()
        metrics["rollout_is_weight_min"] = torch.where(mask, weights, torch.full_like(weights, math.inf)).amin()
        if mode.endswith("_mask"):
            metrics["rollout_is_masked_frac"] = masked_mean((weights == 0).float(), mask)
            metrics["rollout_is_masked_seq_frac"] = sequence_fraction(weights == 0, mask)
    if statistic is not None:
        keep = rejection_keep(old, behaviour, loss_mask, statistic, rs_low, rs_high)  # (n, 1)
        per_token = per_token * keep.to(per_token.dtype)
        metrics["rollout_rs_rejected_frac"] = masked_mean((1 - keep).expand_as(per_token), mask)
        metrics["rollout_rs_rejected_seq_frac"] = sequence_fraction(keep == 0, mask)
    return per_token, metrics
