"""Reduce a per-token loss ``(N, T)`` to a scalar.

Modes (``L`` per-token loss, ``M`` completion mask; see docs/math.md and verl's ``agg_loss``):

* ``token-mean``: ``sum(L*M) / num_tokens`` — every valid token of the mini-batch weighs the same (DAPO, Yu et al.,
  2025, arXiv:2503.14476).
* ``token-sum``: ``sum(L*M)``.
* ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (the original GRPO objective).
* ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
* ``seq-mean-token-sum-norm``: ``sum(L*M) / (num_sequences * norm)``, ``norm`` a constant such as the maximum
  completion length (Dr. GRPO, Liu et al., 2025, arXiv:2503.20783).

For gradient accumulation, pass the **global** ``num_tokens`` / ``num_sequences`` of the whole mini-batch (all
micro-batches, all ranks): each micro-batch then returns its exact share, and the shares add up to the whole-batch
value, independent of micro-batch size and world size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms._checks import check_same_shape
from lightning_grpo.algorithms.catalogue import choose

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

__all__ = ["LOSS_AGG_MODES", "LossAggMode", "aggregate_loss", "count_sequences"]


def count_sequences(completion_mask: Tensor) -> Tensor:
    """Number of rows with at least one valid token (the default ``num_sequences``)."""
    return (completion_mask.sum(-1) > 0).sum()


# Every mode shares one signature: (masked L, M, num_tokens, num_sequences, norm) -> scalar.
def _token_mean(lm: Tensor, mask: Tensor, num_tokens: Tensor, num_sequences: Tensor, norm: float) -> Tensor:
    return lm.sum() / num_tokens


def _token_sum(lm: Tensor, mask: Tensor, num_tokens: Tensor, num_sequences: Tensor, norm: float) -> Tensor:
    return lm.sum()


def _seq_mean_token_mean(lm: Tensor, mask: Tensor, num_tokens: Tensor, num_sequences: Tensor, norm: float) -> Tensor:
    per_sequence = lm.sum(-1) / mask.sum(-1).clamp(min=1)  # (N,); empty rows give 0
    return per_sequence.sum() / num_sequences


def _seq_mean_token_sum(lm: Tensor, mask: Tensor, num_tokens: Tensor, num_sequences: Tensor, norm: float) -> Tensor:
    return lm.sum() / num_sequences


def _seq_mean_token_sum_norm(
    lm: Tensor, mask: Tensor, num_tokens: Tensor, num_sequences: Tensor, norm: float
) -> Tensor:
    return lm.sum() / (num_sequences * norm)


#: Read-only catalogue: aggregation mode -> function of one shared signature.
LOSS_AGG_MODES: Mapping[str, Callable[..., Tensor]] = MappingProxyType(
    {
        "token-mean": _token_mean,
        "token-sum": _token_sum,
        "seq-mean-token-mean": _seq_mean_token_mean,
        "seq-mean-token-sum": _seq_mean_token_sum,
        "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    }
)


def aggregate_loss(
    values: Tensor,
    completion_mask: Tensor,
    mode: LossAggMode = "token-mean",
    *,
    num_tokens: Tensor | float | None = None,
    num_sequences: Tensor | float | None = None,
    norm: float | None = None,
) -> Tensor:
    """Aggregate a per-token loss over valid tokens.

    Args:
        values: ``(N, T)`` per-token loss.
        completion_mask: ``(N, T)`` 1 for valid completion tokens, 0 for padding.
        mode: Aggregation mode, see :data:`LOSS_AGG_MODES`.
        num_tokens: Global count of valid tokens; defaults to ``completion_mask.sum()``.
        num_sequences: Global count of sequences with a valid token; defaults to that count here.
        norm: Constant divisor of ``seq-mean-token-sum-norm``; defaults to ``T`` (pass the maximum completion length
            so that every micro-batch uses the same value).

    Returns:
        A 0-dim tensor. Empty masks give 0, never NaN.

    Raises:
        ValueError: Unknown ``mode``, mismatched shapes, or a non-positive ``norm``.

    Example::

        >>> L = torch.tensor([[1.0, 3.0], [2.0, 0.0]]); M = torch.tensor([[1, 1], [1, 0]])
        >>> aggregate_loss(L, M, "token-mean")  # (1 + 3 + 2) / 3
        tensor(2.)
        >>> aggregate_loss(L, M, "seq-mean-token-mean")  # ((1 + 3) / 2 + 2 / 1) / 2
        tensor(2.)
    """
    reduce = choose(LOSS_AGG_MODES, mode, "loss aggregation mode")
    check_same_shape(values=values, completion_mask=completion_mask)
    if norm is not None and norm <= 0:
        raise ValueError(f"norm must be positive, got {norm}")
    mask = completion_mask.to(values.dtype)
    num_tokens = mask.sum() if num_tokens is None else num_tokens
    num_sequences = count_sequences(completion_mask) if num_sequences is None else num_sequences
    num_tokens = torch.as_tensor(num_tokens, dtype=values.dtype, device=values.device).clamp(min=1)
    num_sequences = torch.as_tensor(num_sequences, dtype=values.dtype, device=values.device).clamp(min=1)
    masked = torch.where(completion_mask.bool(), values, torch.zeros_like(values))  # NaN-safe on padding
    return reduce(masked, mask, num_tokens, num_sequences, float(norm or values.shape[-1]))
