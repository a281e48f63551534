"""Per-token log-probs (and entropy) of a rollout's completions under a causal LM."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_grpo.algorithms import entropy_from_logits, selective_logprobs
from lightning_grpo.rollout.batch import Rollout

__all__ = ["TokenLogProbs", "completion_logprobs", "position_ids_from_mask"]


@dataclass(frozen=True)
class TokenLogProbs:
    """Log-probs ``(N, T)`` of the completion tokens and, when asked, the entropy ``(N, T)`` at those positions."""

    logprobs: Tensor
    entropy: Tensor | None = None


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` uses them: ``cumsum(mask) - 1``, 0 on padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(
    model: nn.Module,
    rollout: Rollout,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_size: int = 1024,
) -> TokenLogProbs:
    """Log-probs of the sampled completion tokens under ``model``, at the sampling temperature.

    Only the logits of completion positions are computed (``logits_to_keep``), and the log-softmax is chunked
    (:func:`~lightning_grpo.algorithms.selective_logprobs`), so no ``(N, P+T, V)`` tensor and no float32
    ``(N, T, V)`` tensor is ever held.

    Args:
        model: Causal LM (the policy, or the policy with its adapter disabled for the reference).
        rollout: The samples.
        temperature: Sampling temperature.
        with_entropy: Also return the per-token entropy.
        entropy_grad: Keep the entropy differentiable (only needed for an entropy bonus).
        chunk_size: Positions per chunk of the log-softmax.

    Returns:
        :class:`TokenLogProbs` with ``(N, T)`` float32 tensors.
    """
    attention_mask = rollout.attention_mask
    num_completion = rollout.completion_ids.shape[1]
    output = model(
        input_ids=rollout.input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=num_completion + 1,
        use_cache=False,
    )
    logits = output.logits[:, :-1]  # (N, T, V): the logits at position t predict completion token t
    logprobs = selective_logprobs(logits, rollout.completion_ids, temperature=temperature, chunk_size=chunk_size)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits, temperature=temperature, chunk_size=chunk_size)
    return TokenLogProbs(logprobs, entropy)
