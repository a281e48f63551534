"""A colocated vLLM engine as the rollout sampler: same prompts, settings, groups, seeds and log-probs as ``generate``.

The engine runs inside the training process (vLLM's in-process engine core), on the training device. It is built
once at fit start from the base model; before each rollout the current adapter (or the merged weights) reaches it
(:meth:`VLLMEngine.sync`). :meth:`VLLMEngine.sample` has the signature of
:func:`~lightning_grpo.rollout.generation.sample_tokens`, so single-turn and multi-turn sampling use it unchanged.
docs/vllm.md explains the settings and the traps this file handles.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends.vllm.files import bytes_needed, make_work_dir, save_base
from lightning_grpo.backends.vllm.settings import VLLMConfig, check_installed
from lightning_grpo.backends.vllm.start import build_llm, engine_environment
from lightning_grpo.backends.vllm.truncation import DEFAULT_MAX_LOGPROBS, kept_margins, logprobs_needed
from lightning_grpo.policy.weights import merged_weights
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings, eos_token_ids

__all__ = ["VLLMEngine"]

_ADAPTER = "policy"  # the engine's one LoRA: synced in place under this name and id


@contextmanager
def _seeded_draws(seed: int, device: torch.device) -> Iterator[None]:
    """vLLM's sampling noise drawn from the default generator of ``device``, seeded with ``seed``; restored after.

    A request with its own seed gets its own generator in vLLM's V1 sampler, which then draws noise row by row: one
    call per row and decode step (on CUDA a kernel launch each, and no FlashInfer sampling), where rows without one
    share a single batched draw (docs/vllm.md, "Seeds", has the counts). The engine runs in this process, so seeding
    the default generator just before ``generate`` makes the draws repeat for the same seed and inputs, as the
    Hugging Face backend's do; restoring it leaves the training's random stream as it was.
    """
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def _position_logprobs(flat: Any, ids: list[int], k: int) -> torch.Tensor:
    """``(n, 1 + k)`` processed log-probs of a completion's ``n`` positions: the sampled token's, then the ``k``
    largest (vLLM's flat log-probs hold exactly these per position, the sampled token first).

    Raises:
        RuntimeError: The log-probs do not have that layout (another vLLM), so none is recorded.
    """
    n = len(ids)
    values, token_ids = getattr(flat, "logprobs", None), getattr(flat, "token_ids", None)
    if values is None or len(values) != n * (1 + k) or token_ids[:: 1 + k] != ids:
        raise RuntimeError(
            f"vLLM returned log-probs in an unexpected layout (wanted {1 + k} per position, the sampled token's "
            "first, as vllm 0.32's FlatLogprobs): this vLLM is not supported by the rollout backend"
        )
    return torch.tensor(values, dtype=torch.float32).view(n, 1 + k)


def _llm_arguments(config: VLLMConfig, device: torch.device, **given: Any) -> dict[str, Any]:
    """``vllm.LLM``'s arguments: ``given`` (model, dtype, seed, length) and the settings that keep it our sampler."""
    eager = config.enforce_eager if config.enforce_eager is not None else device.type != "cuda"
    return dict(
        given,
        skip_tokenizer_init=True,
        generation_config="vllm",
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=config.enable_prefix_caching,
        gpu_memory_utilization=config.gpu_memory_utilization,
        enforce_eager=eager,
        enable_sleep_mode=config.sleep_mode,
    )


class VLLMEngine:
    """The policy's sampler on vLLM. Build it with :meth:`start`; call :meth:`sync` after every update.

    Args:
        llm: The ``vllm.LLM``.
        config: Its settings.
        work_dir: Folder of its adapter (and base model) files, removed by :meth:`close`.
        device: The training device (``cuda`` enables sleep mode when asked for).
    """

    def __init__(self, llm: Any, config: VLLMConfig, work_dir: Path, device: torch.device) -> None:
        self.llm, self.config, self.work_dir, self.device = llm, config, work_dir, device
        self.lora_request: Any = None  # set by the first adapter sync
        self.synced_version: int | None = None
        self.asleep = False
        model_config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        self.vocab_size: int | None = model_config.get_vocab_size() if model_config is not None else None

    @classmethod
    def start(
        cls,
        policy: PeftModel,
        config: VLLMConfig,
        *,
        model_name: str | None,
        max_model_len: int,
        max_lora_rank: int,
        seed: int,
        max_logprobs: int = DEFAULT_MAX_LOGPROBS,
    ) -> VLLMEngine:
        """Build the engine from the base model: ``model_name`` (hub id or folder), else the policy's base saved once.

        ``max_logprobs`` is the most log-probs a position may return: at least the run's ``top_k`` (the margins read
        the top ``top_k`` of each position, :mod:`~lightning_grpo.backends.vllm.truncation`).

        Raises:
            ImportError: vLLM is missing or transformers is outside its range.
            ValueError: ``VLLM_CPU_KVCACHE_SPACE`` in the environment is not whole GiB.
            OSError: The work folder has no room for the engine's files.
            RuntimeError: The engine failed to start (the message names the memory settings to lower when memory
                ran out, and chains vLLM's own error).
        """
        check_installed()
        device = next(policy.parameters()).device
        if device.type == "cuda" and (device.index or 0) != 0:
            raise RuntimeError(
                f"this rank trains on {device}, but vLLM's in-process engine takes the first visible GPU: start each "
                "rank with only its own GPU visible (CUDA_VISIBLE_DEVICES) so that both are cuda:0 (docs/vllm.md)"
            )
        engine_environment(config)
        needed = bytes_needed(policy, adapter=config.sync == "adapter", base=model_name is None)
        work_dir = make_work_dir(config, needed)
        source = model_name or str(save_base(policy, work_dir / "base"))
        dtype = str(next(policy.get_base_model().parameters()).dtype).removeprefix("torch.")
        kwargs = _llm_arguments(
            config, device, model=source, dtype=dtype, seed=seed, max_model_len=max_model_len, max_logprobs=max_logprobs
        )
        if config.sync == "adapter":
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank)
        try:
            llm = build_llm(kwargs, config)
        except Exception:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        return cls(llm, config, work_dir, device)

    # ------------------------------------------------------------------ sync

    def sync(self, policy: PeftModel, version: int, adapter_state: dict[str, torch.Tensor] | None = None) -> bool:
        """Send the policy's current weights unless ``version`` was sent last; reset the prefix cache after.

        Args:
            policy: The policy.
            version: Identifies the weights (the global step): a version already sent is not sent again.
            adapter_state: The adapter's full weights (gathered under FSDP2); ``None``: the policy's own.

        Returns:
            Whether weights were sent.
        """
        if version == self.synced_version:
            return False
        self.wake()
        if self.config.sync == "adapter":
            self._load_adapter(policy, adapter_state)
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": merged_weights(policy)})
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self.synced_version = version
        return True

    def _load_adapter(self, policy: PeftModel, adapter_state: dict[str, torch.Tensor] | None) -> None:
        from vllm.lora.request import LoRARequest

        path = self.work_dir / "adapter"
        policy.save_pretrained(str(path), state_dict=adapter_state)
        first = self.lora_request is None
        self.lora_request = LoRARequest(_ADAPTER, 1, str(path), load_inplace=not first)
        self.llm.llm_engine.add_lora(self.lora_request)

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """``(B*G, P+T)`` prompt and sampled tokens, G consecutive rows per prompt, each token's log-prob and, when
        the settings truncate, its kept set as a margin.

        A :data:`~lightning_grpo.rollout.sampling_settings.SampleFn`, as
        :func:`~lightning_grpo.rollout.generation.sample_tokens` (``model`` and ``request.rows`` are not used: the
        engine holds the synced weights, and vLLM's prefix cache reuses earlier turns). Prompts go in as our token
        ids. The requests carry no seed of their own: the engine draws every row's noise in one batched call from the
        default generator, seeded by a seed drawn from torch's global generator, which the step seeds, so the same
        seed samples the same completions (:func:`_seeded_draws`). The log-probs are vLLM's processed ones (those of
        the kept set it drew from); the margins come from the top ``K`` of them
        (:mod:`~lightning_grpo.backends.vllm.truncation`).

        Raises:
            SettingError: top-p below 1 without top-k (its kept set cannot be recorded).
        """
        prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        k = logprobs_needed(settings, "vllm")
        if self.vocab_size is not None:
            k = min(k, self.vocab_size)
        self.wake()
        rows = zip(prompt_ids, prompt_mask, strict=True)
        prompts = [{"prompt_token_ids": row[mask.bool()].tolist()} for row, mask in rows]  # our tokens, unpadded
        seed = int(torch.randint(0, 2**31 - 1, (1,)))
        with _seeded_draws(seed, self.device):
            params = self._params(settings, tokenizer, k)  # one for all prompts, no per-request seed
            outputs = self.llm.generate(prompts, params, lora_request=self.lora_request, use_tqdm=False)
        completions = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        width = max(1, *(len(c.token_ids) for c in completions))
        tokens = torch.full((len(completions), width), tokenizer.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros(tokens.shape, dtype=torch.float32)
        margins = torch.zeros(tokens.shape, dtype=torch.float32) if settings.truncates else None
        for i, completion in enumerate(completions):
            ids = list(completion.token_ids)
            values = _position_logprobs(completion.logprobs, ids, k)  # (n, 1 + K): the sampled token's, then the top K
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs[i, : len(ids)] = values[:, 0]
            if margins is not None:
                margins[i, : len(ids)] = kept_margins(values[:, 0], values[:, 1:], settings, vocab_size=self.vocab_size)
        g, device = settings.num_generations, prompt_ids.device
        sequences = torch.cat([prompt_ids.repeat_interleave(g, dim=0), tokens.to(device)], dim=1)
        return Sampled(sequences, logprobs.to(device), None if margins is None else margins.to(device))

    @staticmethod
    def _params(settings: SamplingSettings, tokenizer: PreTrainedTokenizerBase, logprobs: int) -> Any:
        """vLLM's sampling parameters for ``settings``: every knob set, so no engine default changes the draw; the
        top ``logprobs`` processed log-probs of every position returned besides the sampled token's, flat."""
        from vllm import SamplingParams

        return SamplingParams(
            n=settings.num_generations,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k or -1,
            min_p=settings.min_p,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_tokens=settings.max_new_tokens,
            min_tokens=settings.min_new_tokens,
            stop_token_ids=eos_token_ids(tokenizer).tolist(),
            ignore_eos=True,
            logprobs=logprobs,
            flat_logprobs=True,
            seed=None,
            detokenize=False,
        )

    # ------------------------------------------------------------------ memory and shutdown

    def sleep(self) -> None:
        """With ``sleep_mode`` on CUDA: free the KV cache and offload the weights until the next sync or sample."""
        if self.config.sleep_mode and self.device.type == "cuda" and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down and remove its files; safe to call twice."""
        llm, self.llm = self.llm, None
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
            _shutdown_compile_workers()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _shutdown_compile_workers() -> None:
    """Stop the worker processes torch's compiler started for the engine's compiled sampling ops (vLLM compiles its
    log-prob kernel with ``torch.compile``): they would outlive the process that started them. A later compile starts
    new ones."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:  # another torch: nothing to stop
        return
    shutdown_compile_workers()
