"""Truncated importance sampling (TIS): correcting for a sampler whose log-probs differ from the trainer's.

A rollout engine (vLLM, another dtype or kernel) samples from ``π_behaviour``, which is close to, but not exactly,
the trainer's ``π_old``. TIS (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training"; verl's rollout correction, TRL's ``vllm_importance_sampling_cap``) weights each token's policy loss by

    w_t = min(π_old(y_t) / π_behaviour(y_t), C)

with no gradient through ``w_t``; ``C`` (the cap) bounds the variance. docs/vllm.md shows when it matters.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["truncated_importance_weights"]


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
