"""The behaviour distribution of our Hugging Face samplers, in one place: ``generate``'s warpers (temperature, top-k,
top-p, min-p, in that order), and what a sampler records of each drawn token (its log-prob over the kept set and the
kept set as a margin, :class:`~lightning_grpo.rollout.sampling_settings.Sampled`).

Our decode loop (:mod:`~lightning_grpo.rollout.decode`) and the compiled step
(:mod:`~lightning_grpo.rollout.compiled_decode`) record from the very scores they draw from; the ``generate`` path
(:mod:`~lightning_grpo.rollout.generation`) replays the same warpers on the logits ``generate`` hands its processors,
which is deterministic: the same kept set ``generate`` draws from.
"""

from __future__ import annotations

import torch
from transformers.generation import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = ["behaviour", "full_logprobs", "warp", "warpers"]


def warpers(settings: SamplingSettings) -> LogitsProcessorList:
    """Temperature, top-k, top-p and min-p in ``generate``'s order (each only when it changes the distribution)."""
    found = LogitsProcessorList()
    if settings.temperature != 1.0:
        found.append(TemperatureLogitsWarper(settings.temperature))
    if settings.top_k > 0:
        found.append(TopKLogitsWarper(settings.top_k))
    if settings.top_p < 1.0:
        found.append(TopPLogitsWarper(settings.top_p))
    if settings.min_p > 0.0:
        found.append(MinPLogitsWarper(settings.min_p))
    return found


def warp(scores: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """``scores`` ``(n, V)`` through :func:`warpers`: ``scores / temperature`` on the kept tokens, ``-inf`` elsewhere.

    The warpers are called one by one (the list's own call inspects signatures, which ``torch.compile`` cannot trace).
    """
    for warper in warpers(settings):
        scores = warper(None, scores)
    return scores


def full_logprobs(logits: torch.Tensor, chosen: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(n,)`` log-prob of ``chosen`` under ``softmax(logits / temperature)`` over the whole vocabulary (``logits``
    float32, ``(n, V)``)."""
    scaled = logits / temperature
    return scaled.gather(-1, chosen[:, None]).squeeze(-1) - scaled.logsumexp(-1)


def behaviour(
    logits: torch.Tensor,
    warped: torch.Tensor,
    chosen: torch.Tensor,
    settings: SamplingSettings,
    finished: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a sampler records of the tokens ``chosen`` ``(n,)`` it drew from ``softmax(warped)``: log-probs and margins.

    When ``settings`` truncate nothing the log-prob is :func:`full_logprobs` of ``logits`` (``min_new_tokens``'s EOS
    ban aside, the arithmetic it always was) and the margins are ``None``. Otherwise the log-prob is
    ``log_softmax(warped)[chosen]``, renormalised over the kept set ``S`` (the finite entries of ``warped``, which
    equal ``z = logits / temperature`` there), and the margin is ``z[chosen] - min(z[S])`` (``inf`` where ``S`` is the
    whole vocabulary), rounded up by one float32 step where the subtraction rounded down, so that the replay
    ``{v: z[v] >= z[chosen] - margin}`` on these very ``z`` keeps the lowest kept token (exactly ``S``, ties at its
    boundary aside); there rows in ``finished`` (their token is padding, outside any kept set) record 0 and 0.

    Args:
        logits: ``(n, V)`` float32 logits, before any processor.
        warped: ``(n, V)`` the scores the token was drawn from (:func:`warp` of ``logits``, EOS barred under
            ``min_new_tokens``).
        chosen: ``(n,)`` the drawn tokens.
        settings: The sampling settings.
        finished: ``(n,)`` bool, rows that had ended before this step; ``None``: none.

    Returns:
        ``(n,)`` float32 log-probs and ``(n,)`` float32 margins (``None`` when nothing truncates).
    """
    if not settings.truncates:
        return full_logprobs(logits, chosen, settings.temperature), None
    kept = torch.isfinite(warped)
    value = warped.gather(-1, chosen[:, None]).squeeze(-1)
    logprobs = value - warped.logsumexp(-1)
    lowest = warped.masked_fill(~kept, float("inf")).amin(-1)
    margins = value - lowest
    rounded_in = torch.nextafter(margins, torch.full_like(margins, float("inf")))  # one float32 step up
    margins = torch.where(value - margins > lowest, rounded_in, margins).masked_fill(kept.all(-1), float("inf"))
    if finished is not None:
        logprobs, margins = logprobs.masked_fill(finished, 0.0), margins.masked_fill(finished, 0.0)
    return logprobs, margins
