"""The types of one GRPO iteration: what the update reads (:class:`UpdateBatch`, :class:`LossCounts`) and what
``training_step`` returns to the callbacks (:class:`StepOutput`).

A subclass that overrides a phase builds or reads these: ``prepare_update`` returns an :class:`UpdateBatch`,
``compute_loss(batch, counts)`` receives one micro-batch and the mini-batch's :class:`LossCounts` (docs/index.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypedDict

import torch
from torch import Tensor

from lightning_grpo.algorithms import LossAggMode, aggregate_loss, count_sequences
from lightning_grpo.algorithms.peer_normalisers import PeerNormalisers
from lightning_grpo.algorithms.statistics import SumAcrossRanks
from lightning_grpo.rewards import RewardScores
from lightning_grpo.rollout import Rollout

__all__ = ["LossCounts", "StepOutput", "UpdateBatch"]


class StepOutput(TypedDict):
    """What ``training_step`` returns, for callbacks' ``on_train_batch_end``."""

    loss: Tensor  # mean mini-batch loss over all ranks, detached
    rollout: Rollout  # texts, tokens, masks, truncation flags, group ids
    rewards: RewardScores  # combined and per-function rewards, (N,)
    advantages: Tensor  # (N,) or (N, T)
    metrics: dict[str, Tensor]  # update statistics (pg_loss, clip fractions, KL, entropy, ...), global, 0-dim
    loss_mask: Tensor  # (N, T) tokens that entered the loss
    timings: dict[str, float]  # seconds per phase: generate, score, old_logprobs, reference, update
    ppo_epochs: int  # passes over the rollout: each loss token was trained on this many times


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
        at_sampling_weights: The policy still has the weights that sampled the rollout (the first mini-batch of an
            iteration, before its optimizer step): ``compute_loss`` then logs the sampling/training agreement.
        old_kept_log_mass: ``(N, T)`` the old policy's log-probability mass on the sampler's kept sets
            (``TokenLogProbs.kept_log_mass`` of the recomputed old log-probs); ``None`` when the old log-probs are
            not recomputed or nothing was truncated.
    """

    rollout: Rollout
    advantages: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    at_sampling_weights: bool = False
    old_kept_log_mass: Tensor | None = None

    def __len__(self) -> int:
        return len(self.rollout)

    def select(self, index: Tensor) -> UpdateBatch:
        """The rows ``index`` as a new batch (``index`` is best kept on the CPU: no host sync for the list fields)."""
        index = index.to(self.advantages.device, non_blocking=True)
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return replace(
            self,
            rollout=self.rollout.select(index),
            advantages=self.advantages[index],
            loss_mask=self.loss_mask[index],
            old_logprobs=pick(self.old_logprobs),
            ref_logprobs=pick(self.ref_logprobs),
            old_kept_log_mass=pick(self.old_kept_log_mass),
        )


@dataclass(frozen=True)
class LossCounts:
    """Global normalisers of one mini-batch: valid tokens and sequences over all micro-batches and all ranks.

    ``compute_loss`` divides by these, so a micro-batch's loss is its share of the mini-batch's global loss and the
    result depends on neither the micro-batch size nor the world size (docs/math.md, "Loss aggregation").

    Attributes:
        num_tokens: 0-dim, tokens of the loss mask over the whole mini-batch on every rank.
        num_sequences: 0-dim, sequences with at least one such token.
        norm: Divisor of ``seq-mean-token-sum-norm`` (``loss_agg_norm``, or ``max_new_tokens``).
        peer: The peers' normalisers of the mini-batch when a setting asks for one (gmpo ``rows: all``, the
            rejection's ``normalise: kept``; :mod:`~lightning_grpo.algorithms.peer_normalisers`); ``None``: none,
            or counted per micro-batch.

    Example::

        >>> mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
        >>> counts = LossCounts.of(mask, norm=3.0, sum_across_ranks=lambda t: t)  # one process: no reduce
        >>> counts.num_tokens.item(), counts.num_sequences.item()
        (2.0, 1.0)
    """

    num_tokens: Tensor
    num_sequences: Tensor
    norm: float
    peer: PeerNormalisers | None = None

    @classmethod
    def of(
        cls, loss_mask: Tensor, norm: float, sum_across_ranks: SumAcrossRanks, peer: PeerNormalisers | None = None
    ) -> LossCounts:
        """Count ``loss_mask`` (the whole mini-batch on this rank) and sum the counts over ranks in one reduce."""
        local = torch.stack([loss_mask.sum(), count_sequences(loss_mask)]).float()
        num_tokens, num_sequences = sum_across_ranks(local).unbind()
        return cls(num_tokens, num_sequences, norm, peer)

    def aggregate(self, values: Tensor, loss_mask: Tensor, mode: LossAggMode) -> Tensor:
        """Aggregate a micro-batch's ``(n, T)`` per-token ``values`` over ``loss_mask`` with these global counts.

        Example::

            >>> counts = LossCounts(torch.tensor(4.0), torch.tensor(2.0), norm=2.0)  # the whole mini-batch
            >>> counts.aggregate(torch.ones(1, 2), torch.ones(1, 2), "token-mean")  # this micro-batch: 2 of 4 tokens
            tensor(0.5000)
        """
        return aggregate_loss(
            values, loss_mask, mode, num_tokens=self.num_tokens, num_sequences=self.num_sequences, norm=self.norm
        )
