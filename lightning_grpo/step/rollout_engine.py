"""The rollout engine's life within a fit: checked at construction, started at fit start, synced before each rollout,
put to sleep for the update, closed at the end of fit or on an exception (docs/vllm.md)."""

from __future__ import annotations

import atexit

from peft import PeftModel

from lightning_grpo.config import GRPOConfig
from lightning_grpo.distributed import full_adapter_state_dict, is_sharded
from lightning_grpo.policy import PolicyConfig
from lightning_grpo.rollout.generation import SampleFn
from lightning_grpo.rollout.vllm_settings import VLLMConfig, check_installed, check_sampling, engine_lora_rank

__all__ = ["VLLMRollout"]


class VLLMRollout:
    """A module's colocated vLLM engine (``rollout_backend: vllm``).

    Construction checks everything that can be checked before a fit (vLLM installed, transformers in its range,
    settings it can honour, the LoRA rank); :meth:`start` builds the engine.

    Args:
        config: The engine's settings.
        grpo: The run's algorithm settings (sampling settings, lengths).
        policy: The policy's settings (LoRA rank, quantization).
        model_name: The model's hub id or folder, loaded by the engine as it is; ``None``: the policy was given as an
            object and its base is saved once for the engine.
        generate_overridden: Whether the module's ``generate`` is a subclass's own (refused: it would bypass the
            engine).
    """

    def __init__(
        self,
        config: VLLMConfig,
        grpo: GRPOConfig,
        policy: PolicyConfig,
        *,
        model_name: str | None,
        generate_overridden: bool,
    ) -> None:
        check_installed()
        check_sampling(grpo.sampling_kwargs, generate_overridden=generate_overridden,
                       quantized=policy.quantization is not None)  # fmt: skip
        self.config, self.model_name = config, model_name
        self.lora_rank = engine_lora_rank(config, policy.lora_r)
        self.max_model_len = config.max_model_len or grpo.max_prompt_length + grpo.max_new_tokens
        self.engine = None

    @classmethod
    def of(
        cls,
        config: VLLMConfig | None,
        grpo: GRPOConfig,
        policy: PolicyConfig,
        *,
        model_name: str | None,
        generate_overridden: bool,
    ) -> VLLMRollout | None:
        """The engine's owner when ``grpo.rollout_backend`` is ``"vllm"``, else ``None``.

        Raises:
            ValueError: ``config`` is given while the backend is ``"hf"`` (it would be ignored).
        """
        if grpo.rollout_backend != "vllm":
            if config is not None:
                raise ValueError("vllm settings were given but grpo.rollout_backend is 'hf'; set rollout_backend: vllm")
            return None
        return cls(config or VLLMConfig(), grpo, policy, model_name=model_name, generate_overridden=generate_overridden)

    def start(self, policy: PeftModel, seed: int, *, sharded: bool) -> None:
        """Build the engine once (later calls do nothing); it is closed at interpreter exit at the latest."""
        if self.engine is not None:
            return
        if sharded and self.config.sync == "merged":
            raise ValueError("vllm.sync='merged' does not support FSDP2 (sharded base weights); use sync: adapter")
        from lightning_grpo.rollout.vllm_engine import VLLMEngine  # imports vLLM only when it is chosen

        self.engine = VLLMEngine.start(
            policy, self.config, model_name=self.model_name, max_model_len=self.max_model_len,
            max_lora_rank=self.lora_rank, seed=seed,
        )  # fmt: skip
        atexit.register(self.close)

    def sampler(self, policy: PeftModel, version: int) -> SampleFn:
        """The engine's sampler, after sending it weights ``version`` (the global step) if they are not there yet.

        Under FSDP2 the adapter is gathered whole first: a collective, which every rank reaches with the same
        ``version``.
        """
        if self.engine is None:
            raise RuntimeError("the vLLM engine is not running: it starts at fit start (GRPOModule.on_fit_start)")
        if version != self.engine.synced_version:
            adapter = full_adapter_state_dict(policy) if is_sharded(policy) else None
            self.engine.sync(policy, version, adapter)
        return self.engine.sample

    def sleep(self) -> None:
        """Release the engine's memory for the update (``vllm.sleep_mode`` on CUDA)."""
        if self.engine is not None:
            self.engine.sleep()

    def close(self) -> None:
        """Shut the engine down (no process or file left); safe to call twice."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
            atexit.unregister(self.close)
