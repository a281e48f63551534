"""Mini-batches of rollouts whose row count differs between ranks (an agent rollout: one row per branch).

Every rank must run the same number of optimizer steps (DDP all-reduces the gradients of each) and of the
collectives around them. An ordinary rollout has ``prompts × G`` rows on every rank, so ``mini_batch_size`` gives
every rank the same count. An agent rollout's rows are its trajectories' branches, so under DDP the ranks agree on
the largest count (one all-reduce per step) and a rank with fewer mini-batches runs idle ones: one row with an empty
loss mask, which adds nothing to the loss or the gradient but joins every collective. A rank whose agents made no
chat call holds no row at all (``agent_wiring.empty_agent_rollout``): its idle row is made up (:func:`idle_rollout`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from lightning_grpo.iteration.types import UpdateBatch
from lightning_grpo.rollout import Rollout

__all__ = ["agreed_minibatches", "idle_minibatch", "idle_rollout", "ranks_differ"]


def ranks_differ(batch_rows_vary: bool) -> bool:
    """Whether the ranks' row counts may differ: a rollout of varying rows (an agent's) on several processes."""
    return (
        batch_rows_vary
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and (torch.distributed.get_world_size() > 1)
    )


def agreed_minibatches(count: int, sum_across_ranks: Callable[[Tensor], Tensor], device: torch.device) -> int:
    """The largest of the ranks' ``count`` (each rank's mini-batches per pass, ``UpdateConfig.minibatches``)."""
    votes = torch.zeros(torch.distributed.get_world_size(), device=device, dtype=torch.float64)
    votes[torch.distributed.get_rank()] = count
    return int(sum_across_ranks(votes).max().item())


def idle_rollout(rollout: Rollout) -> Rollout:
    """One row for a forward that only joins the collectives: the first row of ``rollout``, or, when it has none, a
    made-up row of its widths (token 0, attended, nothing sampled: its loss mask is empty)."""
    if len(rollout):
        return rollout.select(torch.arange(1))
    device = rollout.completion_ids.device
    return replace(
        rollout,
        prompt_ids=_zero_row(rollout.prompt_ids, device),
        prompt_mask=torch.ones_like(_zero_row(rollout.prompt_mask, device)),
        completion_ids=_zero_row(rollout.completion_ids, device),
        completion_mask=torch.ones_like(_zero_row(rollout.completion_mask, device)),
        sampled_mask=_zero_row(rollout.sampled_mask, device),
        truncated=torch.zeros(1, dtype=torch.bool, device=device),
        group_ids=torch.zeros(1, dtype=torch.long, device=device),
        prompts=[None],
        completions=[None],
        columns={key: [None] for key in rollout.columns},
        turns=None,
        logprobs=None if rollout.logprobs is None else _zero_row(rollout.logprobs, device),
        kept_margins=None if rollout.kept_margins is None else _zero_row(rollout.kept_margins, device),
    )


def idle_minibatch(batch: UpdateBatch) -> UpdateBatch:
    """One row of ``batch`` with an empty loss mask: a mini-batch that changes nothing but joins the collectives."""
    if len(batch):
        one = batch.select(torch.arange(1))
        return replace(one, loss_mask=torch.zeros_like(one.loss_mask), advantages=torch.zeros_like(one.advantages))
    return replace(
        batch,
        rollout=idle_rollout(batch.rollout),  # a rank without rows
        advantages=_zero_row_like(batch.advantages),
        loss_mask=_zero_row_like(batch.loss_mask),
        old_logprobs=_zero_row_like(batch.old_logprobs),
        ref_logprobs=_zero_row_like(batch.ref_logprobs),
    )


def _zero_row(tensor: Tensor, device: torch.device) -> Tensor:
    """A row of zeros of ``tensor``'s widths and dtype, on ``device``."""
    return torch.zeros((1, *tensor.shape[1:]), dtype=tensor.dtype, device=device)


def _zero_row_like(tensor: Tensor | None) -> Tensor | None:
    """A row of zeros of ``tensor``'s widths, dtype and device; ``None`` for ``None``."""
    return None if tensor is None else _zero_row(tensor, tensor.device)
