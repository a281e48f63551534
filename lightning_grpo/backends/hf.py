"""The Hugging Face backend (``rollout_backend: hf``, the default): the policy samples itself, in this process.

Sampling is :func:`~lightning_grpo.rollout.generation.sample_tokens`: Hugging Face ``generate`` with each prompt
prefilled once for its G samples, or our own decoding loop (``GRPOConfig.sampler``, ``drop_finished``). With the turn
cache (``GRPOConfig.turn_cache``) a session keeps each trajectory's KV cache from one agent turn to the next
(:class:`~lightning_grpo.rollout.turn_cache.TurnCache`, our own loop). The policy
*is* the sampler's weights, so there is nothing to start, sync, release or close; ``GRPOConfig.sampling_adapter``
sets how the adapter samples for the length of a session.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import ClassVar, Literal

import torch
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends.protocol import OPTIONAL_SETTINGS, BackendRun
from lightning_grpo.policy.sampling_adapter import sampling_adapter
from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import Sampled, SamplingSettings
from lightning_grpo.rollout.turn_cache import TurnCache

__all__ = ["HFBackend", "HFSession"]


class HFSession:
    """One rollout sampled by the policy itself, its adapter in ``mode`` until :meth:`close`.

    Args:
        policy: The policy.
        mode: ``GRPOConfig.sampling_adapter``.
        turn_cache: Keep each trajectory's KV cache across agent turns (:class:`~lightning_grpo.rollout.turn_cache.
            TurnCache`; every turn is sampled by our own decoding loop); ``False``: each turn re-prefills its context.
    """

    def __init__(
        self, policy: nn.Module, mode: Literal["as_trained", "base_dtype", "merged"], *, turn_cache: bool = False
    ) -> None:
        self._stack = ExitStack()
        self._stack.enter_context(sampling_adapter(policy, mode))
        self.turn_cache = TurnCache() if turn_cache else None

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
        """:meth:`TurnCache.sample <lightning_grpo.rollout.turn_cache.TurnCache.sample>` with the turn cache, else
        :func:`~lightning_grpo.rollout.generation.sample_tokens` (no state kept between turns)."""
        if self.turn_cache is not None and rows:  # no rows: a call that only keeps a rank in step, not under a cache
            return self.turn_cache.sample(model, tokenizer, prompt_ids, prompt_mask, settings, rows=rows)
        return sample_tokens(model, tokenizer, prompt_ids, prompt_mask, settings)

    def close(self) -> None:
        """Drop the kept caches; restore the adapter as trained."""
        if self.turn_cache is not None:
            self.turn_cache.close()
        self._stack.close()


class HFBackend:
    """Hugging Face ``generate`` (or our own decoding loop) on the policy itself: ``rollout_backend: hf``.

    Args:
        settings: ``None``: the backend takes no settings of its own (the sampling settings are ``GRPOConfig``'s).
        run: The run it samples for.

    Example::

        >>> from lightning_grpo import GRPOConfig, PolicyConfig
        >>> backend = HFBackend(None, BackendRun(GRPOConfig(), PolicyConfig()))
        >>> sorted(backend.supported_settings) == sorted(OPTIONAL_SETTINGS)
        True
    """

    settings_class: ClassVar[type | None] = None
    supported_settings: ClassVar[frozenset[str]] = frozenset(OPTIONAL_SETTINGS)
    keeps_turn_cache: ClassVar[bool] = True

    def __init__(self, settings: None, run: BackendRun) -> None:
        self.adapter_mode = run.grpo.sampling_adapter
        self.turn_cache: bool | None = getattr(run.grpo, "turn_cache", None)
        self.multi_turn = run.grpo.max_turns > 1

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Nothing to start: the policy samples itself."""

    def sync(self, policy: PeftModel, version: int) -> None:
        """Nothing to send: the policy's weights are the sampled ones."""

    def session(self, policy: PeftModel, settings: SamplingSettings) -> HFSession:
        """A session with the adapter in ``GRPOConfig.sampling_adapter``'s mode, keeping a turn cache if
        ``GRPOConfig.turn_cache`` asks for one (``None``: when ``max_turns > 1`` and ``settings`` already sample with
        our own loop, ``sampler: inverse_cdf`` or ``drop_finished``; the default ``multinomial`` sampler keeps
        ``generate`` unless ``turn_cache`` is ``True``).

        Raises:
            ValueError: ``turn_cache=True`` with settings our own loop cannot sample under (FSDP2's synchronised
                sampling, ``static_cache``).
        """
        blocker = _turn_cache_blocker(settings)
        if self.turn_cache is True and blocker:
            raise ValueError(
                f"GRPOConfig.turn_cache=True cannot be kept {blocker}: the Hugging Face backend samples those with "
                "generate, which re-prefills every turn; set turn_cache to None (auto) or False"
            )
        keep = self.turn_cache is True or (self.turn_cache is None and self.multi_turn and settings.own_loop)
        return HFSession(policy, self.adapter_mode, turn_cache=keep)

    def release(self) -> None:
        """Nothing held: the KV cache of ``generate`` is freed when sampling returns."""

    def close(self) -> None:
        """Nothing to shut down."""


def _turn_cache_blocker(settings: SamplingSettings) -> str:
    """Why the turn cache cannot serve ``settings`` (``""``: it can)."""
    if settings.synced_gpus:
        return "under FSDP2 (synced_gpus: every rank joins every forward)"
    if settings.static_cache:
        return "with static_cache=True"
    return ""
