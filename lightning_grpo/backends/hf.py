"""The Hugging Face backend (``rollout_backend: hf``, the default): the policy samples itself, in this process.

Sampling is :func:`~lightning_grpo.rollout.generation.sample_tokens`: Hugging Face ``generate`` with each prompt
prefilled once for its G samples, or our own decoding loop (``GRPOConfig.sampling.sampler``, ``drop_finished``). With
the turn cache (``GRPOConfig.agents.turn_cache``, on by default for multi-turn runs) a session keeps each trajectory's
KV cache from one agent turn to the next (:class:`~lightning_grpo.rollout.turn_cache.TurnCache`, our own loop). With
``GRPOConfig.sampling.decode: compiled`` the backend keeps a
:class:`~lightning_grpo.rollout.compiled_decode.CompiledDecoder` for the run: its static KV caches (one per shape
bucket) and compiled step serve every session (the agent turns of a multi-turn run excepted when the turn cache is kept:
the turn cache samples those). The policy *is* the sampler's weights, so there is nothing to start or sync;
``GRPOConfig.sampling.sampling_adapter`` sets how the adapter samples for the length of a session.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import ClassVar, Literal

from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends.protocol import OPTIONAL_SETTINGS, BackendSpec
from lightning_grpo.policy.sampling_adapter import sampling_adapter
from lightning_grpo.rollout.buckets import DecodeBuckets, pick_decode_path
from lightning_grpo.rollout.compiled_decode import CompiledDecoder, compile_blocker
from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings
from lightning_grpo.rollout.turn_cache import TurnCache

__all__ = ["HFBackend", "HFSession"]

_log = logging.getLogger(__name__)


class HFSession:
    """One rollout sampled by the policy itself, its adapter in ``mode`` until :meth:`close`.

    Args:
        policy: The policy.
        mode: ``GRPOConfig.sampling.sampling_adapter``.
        turn_cache: Keep each trajectory's KV cache across agent turns (:class:`~lightning_grpo.rollout.turn_cache.
            TurnCache`; every turn is sampled by our own decoding loop); ``False``: each turn re-prefills its context.
        decoder: The compiled decode path (``GRPOConfig.sampling.decode``) that samples every call the turn cache does
            not; ``None``: :func:`~lightning_grpo.rollout.generation.sample_tokens`.
    """

    def __init__(
        self,
        policy: nn.Module,
        mode: Literal["as_trained", "base_dtype", "merged"],
        *,
        turn_cache: bool = False,
        decoder: CompiledDecoder | None = None,
    ) -> None:
        self._stack = ExitStack()
        self._stack.enter_context(sampling_adapter(policy, mode))
        self.turn_cache = TurnCache() if turn_cache else None
        self.decoder = decoder

    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """:meth:`TurnCache.sample <lightning_grpo.rollout.turn_cache.TurnCache.sample>` with the turn cache, else
        the compiled decode path if the session has one, else :func:`~lightning_grpo.rollout.generation.sample_tokens`
        (no state kept between turns)."""
        if self.turn_cache is not None and request.rows:  # no rows: a call that only keeps a rank in step
            return self.turn_cache.sample(model, tokenizer, request)
        return (sample_tokens if self.decoder is None else self.decoder.sample)(model, tokenizer, request)

    def close(self) -> None:
        """Drop the kept caches; restore the adapter as trained."""
        if self.turn_cache is not None:
            self.turn_cache.close()
        self._stack.close()


class HFBackend:
    """Hugging Face ``generate`` (or our own decoding loop) on the policy itself: ``rollout_backend: hf``.

    Args:
        settings: ``None``: the backend takes no settings of its own (the sampling settings are ``GRPOConfig``'s).
        spec: What it samples for: the run's settings, policy and model (:class:`BackendSpec`).

    Example::

        >>> from lightning_grpo import GRPOConfig, PolicyConfig
        >>> backend = HFBackend(None, BackendSpec(GRPOConfig(), PolicyConfig()))
        >>> sorted(backend.supported_settings) == sorted(OPTIONAL_SETTINGS)
        True
    """

    settings_class: ClassVar[type | None] = None
    supported_settings: ClassVar[frozenset[str]] = frozenset(OPTIONAL_SETTINGS)
    keeps_turn_cache: ClassVar[bool] = True
    records_logprobs: ClassVar[bool] = True

    def __init__(self, settings: None, spec: BackendSpec) -> None:
        self.adapter_mode = spec.grpo.sampling.sampling_adapter
        self.turn_cache: bool | None = spec.grpo.agents.turn_cache
        self.multi_turn = spec.multi_turn if spec.multi_turn is not None else spec.grpo.agents.max_turns > 1
        self.decode: str = spec.grpo.sampling.decode
        self.buckets = DecodeBuckets.for_run(
            spec.grpo.sampling.decode_lengths,
            max_prompt_length=spec.grpo.sampling.max_prompt_length,
            max_new_tokens=spec.grpo.sampling.max_new_tokens,
        )
        self.decoder: CompiledDecoder | None = None  # made at the first session that decodes compiled, kept
        self._told: set[str] = set()

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Nothing to start: the policy samples itself."""

    def sync(self, policy: PeftModel, version: int) -> None:
        """Nothing to send: the policy's weights are the sampled ones."""

    def session(self, policy: PeftModel, settings: SamplingSettings) -> HFSession:
        """A session with the adapter in ``GRPOConfig.sampling.sampling_adapter``'s mode, keeping a turn cache when
        :meth:`turn_cache_for` says so.

        With ``GRPOConfig.sampling.decode`` resolving to the compiled path (:func:`~lightning_grpo.rollout.buckets.
        pick_decode_path`), the session keeps the backend's :class:`~lightning_grpo.rollout.compiled_decode.
        CompiledDecoder` for the calls the turn cache does not sample; a multi-turn rollout's turns are sampled by the
        turn cache (our eager loop), which wins over the compiled path (logged once): ``turn_cache: false`` samples
        every turn compiled instead.

        Raises:
            ValueError: ``turn_cache=True`` with settings our own loop cannot sample under (FSDP2's synchronised
                sampling, ``static_cache``); ``decode="compiled"`` with a model that cannot compile.
        """
        keep = self.turn_cache_for(settings)
        decoder = self._decoder(policy, settings)
        if keep and decoder is not None and self.multi_turn:
            self._tell_once(
                "decode: compiled with the turn cache (turn_cache: null, the default, or true): the agent turns are "
                "sampled by the eager loop, which keeps each trajectory's KV cache between turns (set turn_cache: "
                "false to sample every turn compiled, re-prefilling its context)"
            )
        return HFSession(policy, self.adapter_mode, turn_cache=keep, decoder=decoder)

    def turn_cache_for(self, settings: SamplingSettings) -> bool:
        """Whether a session under ``settings`` keeps each trajectory's KV cache across turns.

        ``GRPOConfig.agents.turn_cache`` ``None`` (the default): yes for a multi-turn run (tools or an environment with
        ``max_turns > 1``, or agent code; :attr:`BackendSpec.multi_turn <lightning_grpo.backends.protocol.BackendSpec>`)
        with any sampler, ``multinomial`` included (our loop draws as ``generate`` does: the same tokens for a seed),
        on one process or under DDP; not under FSDP2's synchronised sampling or with ``static_cache``, which
        ``generate`` samples. ``True``: yes, also for a single-turn run. ``False``: no.

        Raises:
            ValueError: ``turn_cache=True`` with settings our own loop cannot sample under (its reason named).
        """
        blocker = _turn_cache_blocker(settings)
        if self.turn_cache is True and blocker:
            raise ValueError(
                f"GRPOConfig.agents.turn_cache=True cannot be kept {blocker}: the Hugging Face backend samples those "
                "with "
                "generate, which re-prefills every turn; set turn_cache to None (auto) or False"
            )
        if self.turn_cache is None:
            return self.multi_turn and not blocker
        return self.turn_cache

    def _decoder(self, policy: nn.Module, settings: SamplingSettings) -> CompiledDecoder | None:
        """The compiled decode path if ``GRPOConfig.sampling.decode`` picks it on the policy's device (made once), else
        None (``"auto"`` also leaves ``static_cache`` and ``drop_finished``, the eager paths' own switches, eager).

        Raises:
            ValueError: ``decode="compiled"`` and the model cannot run it (its class named).
        """
        device = next(policy.parameters()).device.type
        if pick_decode_path(self.decode, device) != "compiled":
            return None
        if self.decode == "auto" and (settings.static_cache or settings.drop_finished):
            return None
        blocker = compile_blocker(policy)
        if blocker and self.decode == "compiled":
            raise ValueError(
                f"GRPOConfig.sampling.decode='compiled' cannot run: {blocker}. Set decode to 'eager' (or 'auto', which "
                "samples "
                "such a model with the eager path: generate, or our own loop with sampler/drop_finished)"
            )
        if blocker:
            self._tell_once(f"decode: auto samples eagerly: {blocker}")
            return None
        if self.decoder is None:
            self.decoder = CompiledDecoder(self.buckets)
        return self.decoder

    def _tell_once(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            _log.warning(message)

    def release(self) -> None:
        """Nothing to free for the update: the compiled path's static caches are kept for the next rollout (they are
        what it reuses); ``generate``'s KV cache is freed when sampling returns."""

    def close(self) -> None:
        """Free the compiled path's static caches (if any)."""
        if self.decoder is not None:
            self.decoder.release()


def _turn_cache_blocker(settings: SamplingSettings) -> str:
    """Why the turn cache cannot serve ``settings`` (``""``: it can)."""
    if settings.synced_gpus:
        return "under FSDP2 (synced_gpus: every rank joins every forward)"
    if settings.static_cache:
        return "with static_cache=True"
    return ""
