"""The sampling seam of a rollout: a stateless :data:`~lightning_grpo.rollout.sampling_settings.SampleFn`, or a
:class:`RolloutSession` that a rollout backend opens for one rollout and samples every turn of it through.

A session sees which trajectories each sampling call continues (``rows``), so it can keep per-trajectory state from
one agent turn to the next (a KV cache, a server-side conversation) and drop it when the rollout ends (:meth:`close`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import Sampled, SampleFn, SamplingSettings

__all__ = ["RolloutSession", "as_sample_fn", "draw"]


@runtime_checkable
class RolloutSession(Protocol):
    """One rollout's sampler, opened by :meth:`RolloutBackend.session <lightning_grpo.backends.RolloutBackend>`.

    Every sampling call of the rollout goes through :meth:`sample`: one call for a single-turn rollout, one per turn
    for a multi-turn one; :meth:`close` is called once when the rollout is done, also when it failed.
    """

    def sample(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        settings: SamplingSettings,
        *,
        rows: Sequence[int],
    ) -> Sampled:
        """Sample one turn: the :data:`~lightning_grpo.rollout.sampling_settings.SampleFn` call, plus ``rows``.

        Args:
            model: The policy (a backend with its own copy of the weights may ignore it).
            tokenizer: Its tokenizer.
            prompt_ids: ``(R, P)`` left-padded contexts: ``R`` prompts, each sampled ``settings.num_generations``
                times (G on a rollout's first call when a group shares its prompt, else 1).
            prompt_mask: ``(R, P)`` their attention mask.
            settings: Sampling settings of this call (``max_new_tokens`` is the turn's budget).
            rows: The trajectory of each returned row (``R * settings.num_generations`` of them, rows of a group
                consecutive): the same number always names the same trajectory within the session. Empty for a
                call that only keeps this rank in step with the others (FSDP, ``synced_gpus``): its result is dropped.

        Returns:
            ``(R * num_generations, P + T)`` sequences and ``(R * num_generations, T)`` token log-probs.
        """
        ...

    def close(self) -> None:
        """Drop the rollout's state; called once, when the rollout ends or fails."""
        ...


def draw(
    sample: SampleFn | RolloutSession | None,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    settings: SamplingSettings,
    *,
    rows: Sequence[int],
) -> Sampled:
    """One sampling call through ``sample``: a session (given ``rows``), a plain ``SampleFn``, or ``None`` (Hugging
    Face, :func:`~lightning_grpo.rollout.generation.sample_tokens`)."""
    if isinstance(sample, RolloutSession):
        return sample.sample(model, tokenizer, prompt_ids, prompt_mask, settings, rows=rows)
    return (sample or sample_tokens)(model, tokenizer, prompt_ids, prompt_mask, settings)


def as_sample_fn(sample: SampleFn | RolloutSession | None) -> SampleFn | None:
    """A single call's ``SampleFn`` of ``sample``: a session samples rows ``0 .. R*G-1``, the whole rollout."""
    if not isinstance(sample, RolloutSession):
        return sample

    def one_call(model: nn.Module, tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor, s: SamplingSettings) -> Any:
        return sample.sample(model, tokenizer, ids, mask, s, rows=range(len(ids) * s.num_generations))

    return one_call
