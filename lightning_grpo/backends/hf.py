"""The Hugging Face backend (``rollout_backend: hf``, the default): the policy samples itself, in this process.

Sampling is :func:`~lightning_grpo.rollout.generation.sample_tokens`: Hugging Face ``generate`` with each prompt
prefilled once for its G samples, or our own decoding loop (``GRPOConfig.sampler``, ``drop_finished``). The policy
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
from lightning_grpo.rollout.generation import Sampled, SamplingSettings, sample_tokens

__all__ = ["HFBackend", "HFSession"]


class HFSession:
    """One rollout sampled by the policy itself, its adapter in ``mode`` until :meth:`close`.

    Args:
        policy: The policy.
        mode: ``GRPOConfig.sampling_adapter``.
    """

    def __init__(self, policy: nn.Module, mode: Literal["as_trained", "base_dtype", "merged"]) -> None:
        self._stack = ExitStack()
        self._stack.enter_context(sampling_adapter(policy, mode))

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
        """:func:`~lightning_grpo.rollout.generation.sample_tokens` (no state kept between turns)."""
        return sample_tokens(model, tokenizer, prompt_ids, prompt_mask, settings)

    def close(self) -> None:
        """Restore the adapter as trained."""
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

    def __init__(self, settings: None, run: BackendRun) -> None:
        self.adapter_mode = run.grpo.sampling_adapter

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Nothing to start: the policy samples itself."""

    def sync(self, policy: PeftModel, version: int) -> None:
        """Nothing to send: the policy's weights are the sampled ones."""

    def session(self, policy: PeftModel, settings: SamplingSettings) -> HFSession:
        """A session with the adapter in ``GRPOConfig.sampling_adapter``'s mode."""
        return HFSession(policy, self.adapter_mode)

    def release(self) -> None:
        """Nothing held: the KV cache of ``generate`` is freed when sampling returns."""

    def close(self) -> None:
        """Nothing to shut down."""
