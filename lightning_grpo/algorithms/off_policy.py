"""Off-policy sequence masking (OPSM, DeepSeek-V3.2, arXiv:2512.02556, Eq. 9).

A sequence with a negative advantage whose mean per-token KL from the sampler to the current policy exceeds ``δ``
(``GRPOConfig.off_policy_mask_threshold``; TRL ``off_policy_mask_threshold``, slime ``--use-opsm``) loses its
policy loss::

    keep_i = 1[A_i >= 0]  or  1[(1/|o_i|) Σ_t (log π_sampler(o_t) - log π_θ(o_t)) <= δ]

``π_sampler`` is the sampler's log-probs (``Rollout.logprobs``) when the rollout has them, else the old log-probs
(TRL's rule); ``π_θ`` is detached. Advantages of shape ``(n, T)`` are compared token by token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import masked_mean, sequence_fraction

__all__ = ["off_policy_mask", "off_policy_masked"]


@torch.no_grad()
def off_policy_mask(
    advantages: Tensor, logprobs: Tensor, sampler_logprobs: Tensor, loss_mask: Tensor, threshold: float
) -> Tensor:
    """``(n, 1)`` (or ``(n, T)`` for per-token advantages) float keep-mask of OPSM (module docstring).

    Example::

        >>> adv = torch.tensor([1.0, -1.0, -1.0])
        >>> current = torch.tensor([[-2.0, -2.0], [-2.0, -2.0], [-1.0, -1.0]])
        >>> sampler = torch.full((3, 2), -1.0)  # KL 1, 1, 0 per token
        >>> off_policy_mask(adv, current, sampler, torch.ones(3, 2), threshold=0.5)  # keep, drop, keep
        tensor([[1.],
                [0.],
                [1.]])
    """
    mask = loss_mask.bool()
    kl = torch.where(mask, sampler_logprobs.float() - logprobs.detach().float(), torch.zeros((), device=mask.device))
    kl = torch.nan_to_num(kl, nan=0.0)  # tokens the sampler could not score carry no evidence (as TRL)
    mean_kl = kl.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # (n, 1)
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    return ((adv >= 0) | (mean_kl <= threshold)).float()


def off_policy_masked(
    per_token: Tensor,
    advantages: Tensor,
    logprobs: Tensor,
    sampler_logprobs: Tensor,
    loss_mask: Tensor,
    threshold: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``per_token`` times the OPSM mask, ``opsm_masked_frac`` (the share of loss tokens dropped) and
    ``opsm_masked_seq_frac`` (``[sequences with a dropped token, sequences]``); ``None``: off."""
    if threshold is None:
        return per_token, {}
    keep = off_policy_mask(advantages, logprobs, sampler_logprobs.to(per_token.device), loss_mask, threshold)
    dropped = (1 - keep).expand_as(per_token)
    metrics = {
        "opsm_masked_frac": masked_mean(dropped, loss_mask.bool()),
        "opsm_masked_seq_frac": sequence_fraction(keep == 0, loss_mask),
    }
    return per_token * keep.to(per_token.dtype), metrics
