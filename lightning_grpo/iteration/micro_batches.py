"""Micro-batches by count and by token budget, the same number on every rank.

With ``micro_batch_tokens`` the rows of a mini-batch are split into the fewest micro-batches whose tokens (prompt and
completion, padding excluded: what a packed row holds) stay within the budget, balanced by longest-first assignment
to the least loaded micro-batch (so none is mostly empty). ``micro_batch_size``, when also set, caps the rows of each.
The ranks then agree on the largest count (a collective, before the first forward): a rank that needs fewer splits
its rows into that many, or, where the budget does not allow it, runs empty micro-batches (``[]``) — DDP's gradient
sync and FSDP2's gathers need every rank to run the same number of forwards and backwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from lightning_grpo.rollout import Rollout

__all__ = ["micro_batch_rows", "row_tokens", "split_by_tokens"]


def row_tokens(rollout: Rollout) -> list[int]:
    """Tokens of each row, padding excluded: prompt and completion (one copy to the host)."""
    return (rollout.prompt_mask.sum(-1) + rollout.completion_mask.sum(-1)).tolist()


def split_by_tokens(lengths: list[int], budget: int, max_rows: int | None = None, parts: int = 1) -> list[list[int]]:
    """At least ``parts`` balanced groups of row indices, each within ``budget`` tokens and ``max_rows`` rows.

    Raises:
        ValueError: A row alone is longer than ``budget`` (the message names both numbers and the fix).
    """
    longest = max(lengths, default=0)
    if longest > budget:
        raise ValueError(
            f"micro_batch_tokens={budget} is smaller than the longest sequence of this rollout ({longest} tokens, "
            f"prompt and completion): set micro_batch_tokens to at least {longest} (max_prompt_length + "
            "max_new_tokens covers every rollout), or None to form micro-batches by micro_batch_size alone"
        )
    parts = max(parts, math.ceil(sum(lengths) / budget), math.ceil(len(lengths) / (max_rows or len(lengths) or 1)))
    while (groups := _longest_first(lengths, parts, budget, max_rows)) is None:
        parts += 1
    return groups


def _longest_first(lengths: list[int], parts: int, budget: int, max_rows: int | None) -> list[list[int]] | None:
    """Each row, longest first, into the least loaded of ``parts`` groups it fits in; ``None`` if one does not fit."""
    loads, groups = [0] * parts, [[] for _ in range(parts)]
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        room = [p for p in range(parts) if loads[p] + lengths[row] <= budget and len(groups[p]) < (max_rows or 1 << 62)]
        if not room:
            return None
        best = min(room, key=lambda p: loads[p])
        loads[best] += lengths[row]
        groups[best].append(row)
    return [sorted(group) for group in groups]


def micro_batch_rows(
    rollout: Rollout,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None,
    sum_across_ranks: Callable[[Tensor], Tensor],
    device: torch.device,
) -> list[Tensor]:
    """Host row indices of each micro-batch of ``rollout`` (some may be empty: see the module docstring).

    Without a budget the rows are split by ``micro_batch_size`` (``None``: all at once), the same count on every
    rank (the ranks hold equal numbers of rows); with one, :func:`split_by_tokens` and the ranks' agreement.
    """
    n = len(rollout)
    if micro_batch_tokens is None:
        return list(torch.arange(n, device="cpu").split(micro_batch_size or max(n, 1)))
    lengths = row_tokens(rollout)
    local = split_by_tokens(lengths, micro_batch_tokens, micro_batch_size)
    parts = _largest_across_ranks(len(local), n, sum_across_ranks, device)
    groups = local
    if parts > len(local):  # balanced over the agreed count where the budget allows, else padded with empty ones
        balanced = _longest_first(lengths, parts, micro_batch_tokens, micro_batch_size)
        groups = balanced or [[]] * (parts - len(local)) + local
    return [torch.tensor(group, dtype=torch.long) for group in groups]


def _largest_across_ranks(
    count: int, most: int, sum_across_ranks: Callable[[Tensor], Tensor], device: torch.device
) -> int:
    """The largest ``count`` of all ranks (each at most ``most``), by summing one-hot vectors."""
    votes = torch.zeros(most + 1, device=device)
    votes[count] = 1.0
    return int(sum_across_ranks(votes).nonzero().max())
