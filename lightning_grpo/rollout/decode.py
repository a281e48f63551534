"""Our own decode loop: the KV cache prefilled once per prompt and shared by its G samples, then one batched step per
token, with ``generate``'s processors, a choice of sampler, and finished rows dropped from the batch and the cache.

:func:`~lightning_grpo.rollout.generation.sample_tokens` runs it when :attr:`SamplingSettings.own_loop
<lightning_grpo.rollout.sampling_settings.SamplingSettings.own_loop>` holds (a non-default sampler or
``drop_finished``); the turn cache (:mod:`~lightning_grpo.rollout.turn_cache`) continues from its :class:`DecodeState`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_grpo.rollout.cache_keyword import cache_of, with_cache
from lightning_grpo.rollout.logprobs import position_ids_from_mask
from lightning_grpo.rollout.sampling_settings import Sampled, SamplingSettings
from lightning_grpo.rollout.truncation import behaviour, full_logprobs, warp, warpers

__all__ = ["DecodeState", "LeaveFn", "decode_loop", "decode_steps", "prefill", "token_logprobs"]


def decode_loop(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    settings: SamplingSettings,
    eos_ids: torch.Tensor,
    pad_id: int,
) -> Sampled:
    """Our own sampling loop: ``(B*G, P+T)`` tokens, G consecutive rows per prompt, their log-probs and margins.

    Each prompt is prefilled once and its KV cache repeated G times; each step applies ``generate``'s processors (EOS
    forbidden before ``min_new_tokens``, temperature, top-k, top-p, min-p), draws with ``settings.sampler``, and with
    ``settings.drop_finished`` removes the rows that have produced EOS from the batch and the cache. The log-probs and
    margins are those of :func:`decode_steps` (``Sampled.margins`` is ``None`` when nothing truncates). Call under
    ``no_grad``, in eval mode.
    """
    g, eos_ids = settings.num_generations, eos_ids.to(prompt_ids.device)
    out = prefill(model, prompt_ids, prompt_mask)
    cache, logits = cache_of(out), out.logits[:, -1].float().repeat_interleave(g, dim=0)  # (N, V)
    cache.batch_repeat_interleave(g)
    state = DecodeState(cache, logits, alive=prompt_ids.new_empty(0), mask=prompt_mask.repeat_interleave(g, dim=0))
    tokens, logprobs, margins = decode_steps(model, state, settings, eos_ids, pad_id)
    return Sampled(torch.cat([prompt_ids.repeat_interleave(g, dim=0), tokens], dim=1), logprobs, margins)


def prefill(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    """The model's output on left-padded prompts ``(R, P)``, with a new KV cache and the last position's logits only."""
    positions = position_ids_from_mask(mask)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)


@dataclass
class DecodeState:
    """What :func:`decode_steps` continues from and leaves behind.

    Attributes:
        cache: The KV cache of the rows in the batch.
        logits: ``(n, V)`` float32 next-token logits of those rows.
        alive: Which of the call's rows are in the batch (set by :func:`decode_steps`: all of them at the start).
        mask: ``(n, K)`` attention mask over the cache's positions (zeros: padding, or a token that is never read).
    """

    cache: Any
    logits: torch.Tensor
    alive: torch.Tensor
    mask: torch.Tensor


#: Called with the rows about to leave the batch (``drop_finished``): their call rows, cache rows and mask rows.
LeaveFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def decode_steps(
    model: nn.Module,
    state: DecodeState,
    settings: SamplingSettings,
    eos_ids: torch.Tensor,
    pad_id: int,
    on_leave: LeaveFn | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The decoding steps of :func:`decode_loop` from a prefilled ``state``.

    Each step applies ``generate``'s processors, draws with ``settings.sampler``, feeds the drawn tokens (masked once a
    row has produced EOS), and with ``settings.drop_finished`` removes finished rows from the batch and the cache
    (``on_leave`` sees them first). ``state`` is updated in place: at the end its cache holds the rows in
    ``state.alive``, and ``state.mask`` marks which cache positions hold tokens the rows read.

    Returns:
        ``(tokens, logprobs, margins)``, each ``(N, T)``: the drawn tokens (``pad_id`` after a row's end), their
        float32 log-probs under the distribution drawn from (renormalised over the kept set of top-k, top-p and
        min-p), and float32 kept-set margins (:func:`~lightning_grpo.rollout.truncation.behaviour`); ``margins`` is
        ``None`` when ``settings.truncates`` is false. After a row's end the margins hold 0, and so do the log-probs
        of a truncating call (a non-truncating one scores the padding token there, as it always did).
    """
    mask, logits, cache = state.mask, state.logits, state.cache
    tokens = torch.full((len(mask), settings.max_new_tokens), pad_id, dtype=torch.long, device=mask.device)
    logprobs = torch.zeros(tokens.shape, dtype=torch.float32, device=mask.device)
    margins = torch.zeros(tokens.shape, dtype=torch.float32, device=mask.device) if settings.truncates else None
    alive = torch.arange(len(mask), device=mask.device)  # rows still in the batch
    finished = torch.zeros(len(mask), dtype=torch.bool, device=mask.device)
    for step in range(settings.max_new_tokens):
        scores = logits.index_fill(-1, eos_ids, float("-inf")) if step < settings.min_new_tokens else logits
        warped, ended = warp(scores, settings), finished[alive]  # ended: (n,) the rows in the batch already done
        chosen = _draw(warped, settings.sampler).masked_fill(ended, pad_id)
        tokens[alive, step] = chosen
        logprob, margin = behaviour(logits, warped, chosen, settings, ended)
        logprobs[alive, step] = logprob
        if margins is not None:
            margins[alive, step] = margin
        done = ended | torch.isin(chosen, eos_ids)  # (n,) the rows in the batch
        finished[alive] = done
        if step == settings.max_new_tokens - 1:
            break
        running = int((~done).sum())  # the step's one host sync: stop, and how many rows to keep
        if running == 0:
            break
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        if settings.drop_finished and running < len(alive):
            order = torch.argsort(done.byte(), stable=True)  # the running rows first, in order; no nonzero
            keep = order[:running]
            if on_leave is not None:
                on_leave(alive[order[running:]], order[running:], mask[order[running:], :-1])
            alive, mask, chosen = alive[keep], mask[keep], chosen[keep]
            cache.batch_select_indices(keep)
        out = model(
            input_ids=chosen[:, None],
            attention_mask=mask,
            position_ids=mask.sum(-1, keepdim=True) - 1,
            **with_cache(cache),
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1].float()
    state.alive, state.mask = alive, mask
    return tokens, logprobs, margins


#: The full-vocabulary log-prob of a token (:func:`~lightning_grpo.rollout.truncation.full_logprobs`): what a sampler
#: records when nothing truncates.
token_logprobs = full_logprobs

#: ``generate``'s warpers: temperature, top-k, top-p, min-p (:func:`~lightning_grpo.rollout.truncation.warpers`).
_warpers = warpers


def _draw(scores: torch.Tensor, sampler: str) -> torch.Tensor:
    """One token per row from ``softmax(scores)``."""
    probs = torch.softmax(scores, dim=-1)  # (n, V) float32
    if sampler == "multinomial":
        return torch.multinomial(probs, 1).squeeze(-1)
    cdf = probs.double().cumsum(-1)  # (n, V); a zero-probability token never owns an interval
    u = torch.rand(len(cdf), 1, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
