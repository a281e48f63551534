"""Sampling one gathered batch of the agents' calls (:func:`batch_sampler`), and telling a turn cache which
executions have ended (:class:`CacheEnds`).

Each batch is one call of the rollout's ``sample``; a context shared by calls that start a new branch is prefilled
once (:func:`~lightning_grpo.rollout.agent_client.grouping.group_calls`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.agent_client.gather import BatchSampler, Request, SampledCall
from lightning_grpo.rollout.agent_client.grouping import PADDING, group_calls
from lightning_grpo.rollout.batch import left_pad
from lightning_grpo.rollout.sampling_settings import SampleFn, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.rollout.session import RolloutSession, draw
from lightning_grpo.rollout.turn_cache import TurnCache

__all__ = ["CacheEnds", "batch_sampler"]


class CacheEnds:
    """Tells the turn cache of ``sample`` (a session's, such as the Hugging Face backend's; if it keeps one) when an
    agent's execution has ended, so that it keeps the caches of executions absent from a batch (busy with a tool)
    meanwhile.

    Executions are put in :attr:`ended` by the event loop's thread; :meth:`sampled` and :meth:`drop` run in the
    sampler's (never while a batch is sampled) or once the loop is over.
    """

    def __init__(self, sample: SampleFn | RolloutSession | None) -> None:
        cache = sample if isinstance(sample, TurnCache) else getattr(sample, "turn_cache", None)
        self.cache = cache if isinstance(cache, TurnCache) else None
        if self.cache is not None:
            self.cache.explicit_ends = True  # absent from a batch is not ended: calls arrive as agents make them
        self.ended: deque[int] = deque()  # executions that returned, raised or timed out
        self._rows: dict[int, set[int]] = {}  # the rows (branches) each execution's calls were sampled on

    def sampled(self, batch: list[Request]) -> None:
        """Note the row of each call of ``batch`` as its execution's."""
        if self.cache is not None:
            for request in batch:
                self._rows.setdefault(request.owner, set()).add(request.row)

    def drop(self, rows: Iterable[int] = ()) -> None:
        """Drop the caches of ``rows`` and of every row of the executions that ended."""
        dropped = list(rows)
        while self.ended:
            dropped.extend(self._rows.pop(self.ended.popleft(), ()))
        if self.cache is not None:
            self.cache.finish(dropped)


def batch_sampler(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    settings: SamplingSettings,
    sample: SampleFn | RolloutSession | None,
    ends: CacheEnds,
) -> BatchSampler:
    """Samples a gathered batch in one call of ``sample``, each context shared by calls that start a new branch
    prefilled once (:func:`~lightning_grpo.rollout.agent_client.grouping.group_calls`).

    A turn cache keeps a branch's cache while its agent is out of step (busy with a tool when a batch is sampled):
    it drops the caches of the executions that returned (``ends``) and of the padding rows."""
    eos = set(eos_token_ids(tokenizer).tolist())
    device = next(model.parameters()).device
    padding_rows = itertools.count(-1, -1)  # padding rows' trajectory numbers: never a branch's, never reused

    @torch.no_grad()
    def sample_batch(batch: list[Request]) -> list[SampledCall]:
        ends.sampled(batch)
        ends.drop()  # in this thread, never while a batch is sampled
        groups = group_calls([r.context for r in batch], [r.shared for r in batch])
        ids, mask = left_pad([batch[i].context for i in groups.prompts], tokenizer.pad_token_id, device)
        rows = [batch[i].row if i != PADDING else next(padding_rows) for i in groups.members]
        call = replace(settings, num_generations=groups.g, max_new_tokens=max(r.max_tokens for r in batch))
        out = draw(sample, model, tokenizer, SampleRequest(ids, mask, call, rows=rows))
        ends.drop(row for row, i in zip(rows, groups.members, strict=True) if i == PADDING)
        results: list[Any] = [None] * len(batch)
        new_tokens, logprobs = out.sequences[:, ids.shape[1] :].tolist(), out.logprobs.tolist()
        margins = out.margins.tolist() if out.margins is not None else [None] * len(new_tokens)
        for i, new, lp, kept in zip(groups.members, new_tokens, logprobs, margins, strict=True):
            if i != PADDING:
                cap = batch[i].max_tokens
                end = next((k + 1 for k, t in enumerate(new[:cap]) if t in eos), None)
                n = end or cap
                results[i] = SampledCall(new[:n], lp[:n], end is not None, None if kept is None else kept[:n])
        return results

    return sample_batch
