"""How far the sampler's log-probs are from the trainer's: the gap the rollout corrections correct.

A rollout engine (vLLM, another dtype or kernel) samples from ``π_behaviour``, close to, but not exactly, the
trainer's ``π_old``. :func:`rollout_agreement` measures ``|logprobs - behaviour logprobs|`` over the loss tokens;
the corrections themselves (truncated or masked importance weights, rejection) are
:mod:`~lightning_grpo.algorithms.corrections`' components (``GRPOConfig.corrections.rollout_correction``, docs/vllm.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import masked_mean

__all__ = ["rollout_agreement"]


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
