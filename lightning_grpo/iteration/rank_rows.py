"""Mini-batches of rollouts whose row count differs between ranks (an agent rollout: one row per branch).

Every rank must run the same number of optimizer steps (DDP all-reduces the gradients of each) and of the
collectives around them. An ordinary rollout has ``prompts × G`` rows on every rank, so ``mini_batch_size`` gives
every rank the same count. An agent rollout's rows are its trajectories' branches, so under DDP the ranks agree on
the largest count (one all-reduce per step) and a rank with fewer mini-batches runs idle ones: one row with an empty
loss mask, which adds nothing to the loss or the gradient but joins every collective.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from lightning_grpo.iteration.types import UpdateBatch

__all__ = ["agreed_minibatches", "idle_minibatch", "ranks_differ"]


def ranks_differ(batch_rows_vary: bool) -> bool:
    """Whether the ranks' row counts may differ: a rollout of varying rows (an agent's) on several processes."""
    return (
        batch_rows_vary
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and (torch.distributed.get_world_size() > 1)
    )


def agreed_minibatches(rows: int, mini_batch_size: int | None, sum_across_ranks: Callable[[Tensor], Tensor],
                       device: torch.device) -> int:  # fmt: skip
    """The largest number of mini-batches per pass over all ranks (``ceil(rows / mini_batch_size)`` on each)."""
    count = math.ceil(rows / mini_batch_size) if mini_batch_size else 1
    votes = torch.zeros(torch.distributed.get_world_size(), device=device, dtype=torch.float64)
    votes[torch.distributed.get_rank()] = count
    return int(sum_across_ranks(votes).max().item())


def idle_minibatch(batch: UpdateBatch) -> UpdateBatch:
    """One row of ``batch`` with an empty loss mask: a mini-batch that changes nothing but joins the collectives."""
    one = batch.select(torch.arange(1))
    return replace(one, loss_mask=torch.zeros_like(one.loss_mask), advantages=torch.zeros_like(one.advantages))
