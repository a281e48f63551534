"""Truncated importance sampling (TIS): correcting for a sampler whose log-probs differ from the trainer's.

A rollout engine (vLLM, another dtype or kernel) samples from ``π_behaviour``, which is close to, but not exactly,
the trainer's ``π_old``. TIS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training"; verl's rollout correction, TRL's ``vllm_importance_sampling_cap``) weights each token's policy loss by

    w_t = min(π_old(y_t) / π_behaviour(y_t), C)

with no gradient through ``w_t``; ``C`` (the cap) bounds the variance. docs/vllm.md shows when it matters.
:func:`rollout_agreement` measures the gap that TIS corrects: ``|logprobs - behaviour logprobs|`` over the loss tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import masked_mean

__all__ = ["importance_weighted", "rollout_agreement", "truncated_importance_weights"]


@torch.no_grad()
def truncated_importance_weights(old_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float) -> Tensor:
    """``(N, T)`` weights ``min(exp(old_logprobs - behaviour_logprobs), cap)``, detached.

    Args:
        old_logprobs: ``(N, T)`` log-probs of the sampled tokens under the trainer's policy before the update.
        behaviour_logprobs: ``(N, T)`` log-probs the sampler recorded for the same tokens.
        cap: The truncation ``C`` (at least 1).

    Example::

        >>> old = torch.tensor([[0.0, -1.0, -2.0]])
        >>> behaviour = torch.tensor([[0.0, -2.0, -1.0]])
        >>> truncated_importance_weights(old, behaviour, cap=2.0)  # 1, min(e, 2), e^-1
        tensor([[1.0000, 2.0000, 0.3679]])
    """
    if not (math.isfinite(cap) and cap >= 1.0):
        raise ValueError(f"the importance-sampling cap must be a finite number >= 1, got {cap!r}")
    if old_logprobs.shape != behaviour_logprobs.shape:
        raise ValueError(f"old {tuple(old_logprobs.shape)} and behaviour {tuple(behaviour_logprobs.shape)} differ")
    log_ratio = (old_logprobs.float() - behaviour_logprobs.float()).clamp(-20.0, math.log(cap))  # (N, T)
    return log_ratio.exp()


def importance_weighted(
    per_token: Tensor, old_logprobs: Tensor, behaviour_logprobs: Tensor | None, loss_mask: Tensor, cap: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The ``(n, T)`` policy loss weighted by truncated importance sampling (``GRPOConfig.tis_cap``), and its metrics.

    Args:
        per_token: ``(n, T)`` per-token policy loss.
        old_logprobs: ``(n, T)`` log-probs of the trainer's policy before the update (detached here).
        behaviour_logprobs: ``(n, T)`` log-probs the sampler recorded (``Rollout.logprobs``).
        loss_mask: ``(n, T)`` tokens that enter the loss.
        cap: The truncation ``C``; ``None``: no weighting.

    Returns:
        ``per_token`` unchanged and no metrics when ``cap`` is ``None``; otherwise the weighted loss with
        ``tis_weight_mean`` and ``tis_capped_frac`` (the share of loss tokens whose weight hit the cap).

    Raises:
        ValueError: ``behaviour_logprobs`` is ``None`` (a ``generate`` override that does not fill them).

    Example::

        >>> loss, metrics = importance_weighted(torch.ones(1, 2), torch.zeros(1, 2), -torch.ones(1, 2),
        ...                                     torch.ones(1, 2), cap=2.0)  # min(e, 2) = 2 on both tokens
        >>> loss, metrics["tis_capped_frac"]
        (tensor([[2., 2.]]), tensor(1.))
    """
    if cap is None:
        return per_token, {}
    if behaviour_logprobs is None:
        raise ValueError("tis_cap needs the sampled log-probs (Rollout.logprobs), but this rollout has none: fill "
                         "Rollout.logprobs in your generate override, or set tis_cap: null")  # fmt: skip
    weights = truncated_importance_weights(old_logprobs.detach(), behaviour_logprobs.to(per_token.device), cap)
    mask = loss_mask.bool()  # (n, T)
    capped = (weights >= cap * (1 - 1e-6)).float()
    metrics = {"tis_weight_mean": masked_mean(weights, mask), "tis_capped_frac": masked_mean(capped, mask)}
    return per_token * weights, metrics


def rollout_agreement(logprobs: Tensor, behaviour_logprobs: Tensor | None, loss_mask: Tensor) -> dict[str, Tensor]:
    """``rollout_logprob_diff_mean``/``_max``: ``|logprobs - behaviour_logprobs|`` over the ``(n, T)`` loss tokens.

    Meaningful only while the training log-probs are those of the weights that sampled (before the step's first
    optimizer step); empty for a rollout without behaviour log-probs (``None``).

    Example::

        >>> logprobs, behaviour = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]])
        >>> rollout_agreement(logprobs, behaviour, torch.ones(1, 2))
        {'rollout_logprob_diff_mean': tensor(0.2500), 'rollout_logprob_diff_max': tensor(0.5000)}
    """
    if behaviour_logprobs is None:
        return {}
    diff, mask = (logprobs.detach() - behaviour_logprobs.to(logprobs.device)).abs(), loss_mask.bool()  # (n, T)
    worst = torch.where(mask, diff, torch.zeros_like(diff)).amax() if diff.numel() else diff.new_zeros(())
    return {"rollout_logprob_diff_mean": masked_mean(diff, mask), "rollout_logprob_diff_max": worst}
