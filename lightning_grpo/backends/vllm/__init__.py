"""The colocated vLLM backend (``rollout_backend: vllm``): an in-process vLLM engine on the training device.

``backend.py`` is the backend's life within a fit (:class:`VLLMBackend`), ``engine.py`` the engine that samples
(:class:`VLLMEngine`), ``settings.py`` its settings and the checks run before vLLM is imported (:class:`VLLMConfig`),
``files.py`` the base and adapter files the engine loads, and ``start.py`` how the engine is built (also used by the
vLLM server's launcher, ``lightning_grpo.backends.vllm_server.launch``). Nothing here imports vLLM until an engine
starts (docs/vllm.md).
"""

from lightning_grpo.backends.vllm.backend import VLLMBackend, VLLMSession
from lightning_grpo.backends.vllm.engine import VLLMEngine
from lightning_grpo.backends.vllm.files import bytes_needed, make_work_dir, save_base
from lightning_grpo.backends.vllm.settings import (
    LOG_LEVELS,
    LORA_RANKS,
    VLLMConfig,
    check_installed,
    check_sampling,
    engine_lora_rank,
)
from lightning_grpo.backends.vllm.start import build_llm, engine_environment

__all__ = [
    "LOG_LEVELS",
    "LORA_RANKS",
    "VLLMBackend",
    "VLLMConfig",
    "VLLMEngine",
    "VLLMSession",
    "build_llm",
    "bytes_needed",
    "check_installed",
    "check_sampling",
    "engine_environment",
    "engine_lora_rank",
    "make_work_dir",
    "save_base",
]
