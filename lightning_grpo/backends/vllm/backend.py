"""The vLLM backend (``rollout_backend: vllm``): a colocated engine's life within a fit. Checked at construction,
started at fit start, synced before each rollout, put to sleep for the update, closed at the end of fit or on an
exception (docs/vllm.md). The engine itself is :class:`~lightning_grpo.backends.vllm.engine.VLLMEngine`."""

from __future__ import annotations

import atexit
from typing import Any, ClassVar

from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends.protocol import BackendSpec
from lightning_grpo.backends.vllm.settings import VLLMConfig, check_installed, check_sampling, engine_lora_rank
from lightning_grpo.backends.vllm.truncation import check_truncation, max_logprobs
from lightning_grpo.distributed import full_adapter_state_dict, is_sharded
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings

__all__ = ["VLLMBackend", "VLLMSession"]


class VLLMSession:
    """One rollout sampled by the engine (no state kept between turns: vLLM's prefix cache reuses earlier turns).

    Args:
        engine: The running :class:`~lightning_grpo.backends.vllm.engine.VLLMEngine`.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """The engine's :meth:`~lightning_grpo.backends.vllm.engine.VLLMEngine.sample`."""
        return self.engine.sample(model, tokenizer, request)

    def close(self) -> None:
        """Nothing to drop."""


class VLLMBackend:
    """A module's colocated vLLM engine (``rollout_backend: vllm``).

    Construction checks everything that can be checked before a fit (settings it can honour, top-p with a top-k,
    vLLM installed, transformers in its range, the LoRA rank); :meth:`start` builds the engine.

    Args:
        settings: The engine's settings (the module's ``vllm`` argument or ``grpo.backend.rollout_backend_args``).
        spec: What it samples for (:class:`BackendSpec`): sampling settings and lengths, the policy's LoRA rank and
            quantization, the model's name (``None``: the policy was given as an object and its base is saved once for
            the engine) and whether ``generate`` is overridden (refused: it would bypass the engine).
    """

    settings_class: ClassVar[type | None] = VLLMConfig
    supported_settings: ClassVar[frozenset[str]] = frozenset(
        {"top_p", "top_k", "min_p", "drop_finished", "sampling_adapter"}
    )
    keeps_turn_cache: ClassVar[bool] = False
    records_logprobs: ClassVar[bool] = True
    turn_cache_instead: ClassVar[str] = (
        "it sends each turn's whole context, and vLLM's prefix cache (vllm.enable_prefix_caching, on by default) "
        "reuses the KV blocks of the turns before"
    )

    def __init__(self, settings: VLLMConfig | None, spec: BackendSpec) -> None:
        grpo, policy = spec.grpo, spec.policy
        check_truncation(grpo.sampling.top_p, grpo.sampling.top_k, "vllm")
        check_installed()
        check_sampling(
            vars(grpo.sampling), generate_overridden=spec.generate_overridden, quantized=policy.quantization is not None
        )
        self.config = config = settings or VLLMConfig()
        self.model_name = spec.model_name
        self.lora_rank = engine_lora_rank(config, policy.lora_r)
        self.max_model_len = config.max_model_len or grpo.sampling.max_prompt_length + grpo.sampling.max_new_tokens
        self.max_logprobs = max_logprobs(grpo.sampling.top_k)
        self.engine: Any = None

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Build the engine once (later calls do nothing); it is closed at interpreter exit at the latest."""
        if self.engine is not None:
            return
        if sharded and self.config.sync == "merged":
            raise ValueError("vllm.sync='merged' does not support FSDP2 (sharded base weights); use sync: adapter")
        from lightning_grpo.backends.vllm.engine import VLLMEngine  # imports vLLM only when it is chosen

        self.engine = VLLMEngine.start(
            policy,
            self.config,
            model_name=self.model_name,
            max_model_len=self.max_model_len,
            max_lora_rank=self.lora_rank,
            seed=seed,
            max_logprobs=self.max_logprobs,
        )
        atexit.register(self.close)

    def sync(self, policy: PeftModel, version: int) -> None:
        """Send the policy's weights ``version`` (the global step) to the engine if they are not there yet.

        Under FSDP2 the adapter is gathered whole first: a collective, which every rank reaches with the same
        ``version``.
        """
        engine = self._running()
        if version != engine.synced_version:
            adapter = full_adapter_state_dict(policy) if is_sharded(policy) else None
            engine.sync(policy, version, adapter)

    def session(self, policy: PeftModel, settings: SamplingSettings) -> VLLMSession:
        """A session on the running engine."""
        return VLLMSession(self._running())

    def release(self) -> None:
        """Release the engine's memory for the update (``vllm.sleep_mode`` on CUDA)."""
        if self.engine is not None:
            self.engine.sleep()

    def close(self) -> None:
        """Shut the engine down (no process or file left); safe to call twice."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
            atexit.unregister(self.close)

    def _running(self) -> Any:
        if self.engine is None:
            raise RuntimeError("the vLLM engine is not running: fit, validate, test and predict start it (GRPOModule)")
        return self.engine
