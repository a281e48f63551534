"""Pieces of the policy-update pass: the per-sample training batch, its global counts, and metric sums.

Pure torch; :class:`~lightning_grpo.module.GRPOModule` drives the loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lightning_grpo.algorithms import count_sequences
from lightning_grpo.algorithms.statistics import SumAcrossRanks
from lightning_grpo.rollout import Rollout

__all__ = ["LossCounts", "MetricSums", "UpdateBatch", "minibatch_indices"]


@dataclass(frozen=True)
class UpdateBatch:
    """A rollout with everything its loss needs, row-aligned.

    Attributes:
        rollout: The samples.
        advantages: ``(N,)`` or ``(N, T)`` advantages.
        loss_mask: ``(N, T)`` tokens that enter the loss (the completion mask, minus truncated completions when
            ``mask_truncated_completions`` is on).
        old_logprobs: ``(N, T)`` log-probs under the sampling policy, or ``None`` when every rollout is used for a
            single update (then the detached current log-probs serve and the ratio is exactly 1).
        ref_logprobs: ``(N, T)`` reference log-probs, or ``None`` when the KL coefficient is 0.
    """

    rollout: Rollout
    advantages: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None

    def __len__(self) -> int:
        return len(self.rollout)

    def select(self, index: Tensor) -> UpdateBatch:
        """The rows ``index`` as a new batch."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return replace(
            self,
            rollout=self.rollout.select(index),
            advantages=self.advantages[index],
            loss_mask=self.loss_mask[index],
            old_logprobs=pick(self.old_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
        )


@dataclass(frozen=True)
class LossCounts:
    """Global normalisers of one mini-batch: valid tokens and sequences over all micro-batches and all ranks."""

    num_tokens: Tensor
    num_sequences: Tensor
    norm: float

    @classmethod
    def of(cls, loss_mask: Tensor, norm: float, sum_across_ranks: SumAcrossRanks) -> LossCounts:
        """Count ``loss_mask`` (the whole mini-batch on this rank) and sum the counts over ranks in one reduce."""
        local = torch.stack([loss_mask.sum(), count_sequences(loss_mask)]).float()
        num_tokens, num_sequences = sum_across_ranks(local).unbind()
        return cls(num_tokens, num_sequences, norm)


def minibatch_indices(num_samples: int, mini_batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """A fresh random permutation of the rows, split into mini-batches of ``mini_batch_size``."""
    yield from torch.randperm(num_samples, generator=generator).split(mini_batch_size)


class MetricSums:
    """Token-weighted running sums of per-micro-batch metrics, averaged at the end."""

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._weights: dict[str, Tensor] = {}

    def add(self, metrics: dict[str, Tensor], weight: Tensor) -> None:
        """Add each metric (a 0-dim tensor) with ``weight`` (e.g. the micro-batch's valid-token count)."""
        for name, value in metrics.items():
            value = value.detach().float()
            weight = torch.as_tensor(weight, dtype=value.dtype, device=value.device)
            self._sums[name] = self._sums.get(name, torch.zeros_like(value)) + value * weight
            self._weights[name] = self._weights.get(name, torch.zeros_like(value)) + weight

    def means(self, sum_across_ranks: SumAcrossRanks | None = None) -> dict[str, Tensor]:
        """The weighted mean of each metric (float32), over all ranks when ``sum_across_ranks`` is given (one reduce).

        The module passes :func:`lightning_grpo.metrics.reduce_across_ranks`, so the means are exact global values.
        """
        if not self._sums:
            return {}
        names = list(self._sums)
        stacked = torch.stack(
            [torch.stack([self._sums[n] for n in names]), torch.stack([self._weights[n] for n in names])]
        )
        if sum_across_ranks is not None:
            stacked = sum_across_ranks(stacked)  # (2, M): weighted sums and weights
        return {name: (stacked[0, i] / stacked[1, i].clamp(min=1e-12)).float() for i, name in enumerate(names)}
