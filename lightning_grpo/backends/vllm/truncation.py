"""The kept set vLLM sampled from, read back from its processed log-probs (docs/vllm.md, "Truncated sampling").

vLLM truncates in the order temperature, min-p, top-k, top-p, and its ``processed_logprobs`` are the log-softmax of
the truncated scaled logits ``z = logits / temperature``: ``-inf`` outside the kept set ``S``, and inside it
differences of ``z`` (``lp[a] - lp[b] = z[a] - z[b]``). vLLM's CPU sampler returns no sampling mask, so ``S`` is read
from the ``K`` largest processed log-probs of each position (:func:`logprobs_needed`), and stored as the contract's
margin (:attr:`~lightning_grpo.rollout.sampling_settings.Sampled.margins`, :func:`kept_margins`):

* ``top_k > 0`` (with or without min-p and top-p): ``S`` holds at most ``top_k`` tokens, so the top ``K = top_k``
  hold all of it, and the margin is ``lp[t]`` minus the smallest finite one of them.
* min-p alone: ``S = {v : z[v] >= max(z) + log(min_p)}``, so the largest one is enough (``K = 1``): the margin is
  ``lp[t] - lp[top 1] - log(min_p)``, which replays the same set.
* top-p below 1 without top-k: ``S`` may hold any number of tokens, which no fixed ``K`` can show; refused
  (:func:`check_truncation`).

Nothing here imports vLLM (the server backend uses it too).
"""

from __future__ import annotations

import math

import torch

from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.settings_checks import SettingError

__all__ = ["DEFAULT_MAX_LOGPROBS", "check_truncation", "kept_margins", "logprobs_needed", "max_logprobs"]

#: vLLM's default ``max_logprobs`` (the most log-probs a request may ask for per token).
DEFAULT_MAX_LOGPROBS = 20


def check_truncation(top_p: float, top_k: int, backend: str) -> None:
    """Refuse top-p below 1 without top-k: its kept set cannot be read back from vLLM (see the module's docstring).

    Raises:
        SettingError: Names the settings, why, and the fix (a top-k, or the ``hf`` backend).
    """
    if top_p < 1.0 and top_k == 0:
        raise SettingError(
            f"GRPOConfig.sampling.top_p={top_p!r} with top_k=0: rollout_backend={backend!r} cannot record the tokens "
            "top-p alone keeps (vLLM returns a fixed number of log-probs per token and, on CPU, no sampling mask, "
            "while top-p alone may keep any number of tokens); set GRPOConfig.sampling.top_k (e.g. 50) so that "
            "top-p truncates within the top k, or use rollout_backend='hf' (docs/vllm.md, Truncated sampling)",
            "GRPOConfig.sampling.top_p",
            top_p,
        )


def logprobs_needed(settings: SamplingSettings, backend: str) -> int:
    """``K``, the processed log-probs to ask vLLM for per position: ``top_k``, 1 for min-p alone, 0 untruncated.

    Raises:
        SettingError: top-p below 1 without top-k (:func:`check_truncation`).
    """
    check_truncation(settings.top_p, settings.top_k, backend)
    if settings.top_k > 0:
        return settings.top_k
    return 1 if settings.min_p > 0 else 0


def max_logprobs(top_k: int) -> int:
    """The engine's or server's ``max_logprobs`` for a run with ``top_k``: vLLM's default, or ``top_k`` if larger."""
    return max(DEFAULT_MAX_LOGPROBS, top_k)


def kept_margins(
    sampled: torch.Tensor, top: torch.Tensor, settings: SamplingSettings, *, vocab_size: int | None = None
) -> torch.Tensor:
    """The margin of each position's kept set, from vLLM's processed log-probs.

    Args:
        sampled: ``(n,)`` processed log-prob of each sampled token.
        top: ``(n, K)`` the ``K`` largest processed log-probs of each position (:func:`logprobs_needed`), largest
            first, ``-inf`` outside the kept set.
        settings: The call's sampling settings (they truncate).
        vocab_size: The vocabulary's size, if known: a position whose ``K`` log-probs are all finite and cover it
            keeps the whole vocabulary (margin ``inf``).

    Returns:
        ``(n,)`` float32 margins ``z[t] - min(z[v] for v in S)`` (``>= 0``; for min-p alone the margin down to
        ``max(z) + log(min_p)``, which replays the same set).

    Raises:
        RuntimeError: A sampled token outside the kept set, or a kept set larger than the ``K`` log-probs show
            (neither happens with vLLM's sampler: never a wrong margin recorded).
    """
    sampled, top = sampled.float(), top.float()
    if not bool(torch.isfinite(sampled).all()):
        raise RuntimeError("vLLM returned a sampled token outside its own kept set (a processed log-prob of -inf)")
    if settings.top_k == 0:  # min-p alone: one log-prob, the largest
        return (sampled - top[:, 0] - math.log(settings.min_p)).clamp(min=0.0)
    finite = torch.isfinite(top)
    full = finite.all(-1)  # all K kept: S is these K (it has at most top_k = K tokens, ties at the K-th aside)
    if bool((full & (sampled < top[:, -1])).any()):
        raise RuntimeError(
            f"vLLM kept more tokens than the {top.shape[-1]} log-probs it returned (a sampled token below all of "
            "them): its kept set cannot be recorded, so no margin is"
        )
    margins = (sampled - torch.where(finite, top, torch.inf).amin(-1)).clamp(min=0.0)
    if vocab_size is not None and top.shape[-1] >= vocab_size:
        margins = margins.masked_fill(finite.sum(-1) >= vocab_size, torch.inf)
    return margins
