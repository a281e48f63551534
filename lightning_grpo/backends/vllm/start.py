"""Building the in-process vLLM engine: its environment, its logging, and what it does to the process.

:func:`build_llm` constructs ``vllm.LLM`` with vLLM's log lines at ``VLLMConfig.log_level`` (WARNING by default: the
engine's start-up report would drown the run's own output), without the chat-template warm-up that fails for an
engine without a tokenizer, with the process's random generators, thread setting and ``LD_PRELOAD`` restored after,
and with a failure that names its real cause. docs/vllm.md lists these traps.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lightning_grpo.backends.vllm.settings import VLLMConfig

__all__ = ["build_llm", "engine_environment"]


@contextmanager
def _contained_side_effects() -> Iterator[None]:
    """Undo what building an in-process vLLM engine does to the process.

    It reseeds Python's, NumPy's and torch's global random generators to its own seed, replaces
    ``torch.set_num_threads`` with a no-op that logs a warning, and sets ``LD_PRELOAD`` (which child processes, such
    as DDP workers or tool subprocesses, would inherit).
    """
    import numpy as np

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    set_num_threads, preload = torch.set_num_threads, os.environ.get("LD_PRELOAD")
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        torch.set_num_threads = set_num_threads
        if preload is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = preload


@contextmanager
def _vllm_log_level(level: str) -> Iterator[None]:
    """vLLM's loggers at ``level`` while the engine is built (``VLLM_LOGGING_LEVEL`` is read when vLLM is imported)
    and after it (the ``vllm`` logger keeps the level, so sampling logs no INFO lines either)."""
    previous = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ["VLLM_LOGGING_LEVEL"] = level
    logging.getLogger("vllm").setLevel(level)  # vLLM imported earlier in this process
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
        else:
            os.environ["VLLM_LOGGING_LEVEL"] = previous


def _logging_arguments(level: str) -> dict[str, Any]:
    """``vllm.LLM``'s arguments for ``level``, those its engine arguments have: ``log_level`` (``LLM`` reconfigures
    vLLM's logging at that level) and ``use_tqdm_on_load`` (the weight-loading progress bar, shown at INFO and
    DEBUG only)."""
    from vllm.engine.arg_utils import EngineArgs

    wanted = {"log_level": level, "use_tqdm_on_load": level in ("DEBUG", "INFO")}
    known = {field.name for field in dataclasses.fields(EngineArgs)}
    return {name: value for name, value in wanted.items() if name in known}


@contextmanager
def _no_chat_template_warmup() -> Iterator[None]:
    """Build ``vllm.LLM`` without rendering a chat through the model's chat template.

    ``LLM`` warms its renderer up by rendering a one-message chat, which needs the tokenizer the engine does not load
    (``skip_tokenizer_init``): the warm-up fails and logs a traceback ("Chat template warmup failed"). Prompts reach
    the engine as token ids, never as chats, so the chat step is skipped; the rest of the warm-up runs as vLLM has
    it. Where vLLM has no such renderer, nothing changes.
    """
    try:
        from vllm.renderers.base import BaseRenderer
    except ImportError:
        BaseRenderer = None
    warmup = getattr(BaseRenderer, "warmup", None)
    if warmup is None:
        yield
        return

    def without_chat(renderer: Any, *args: Any, **kwargs: Any) -> Any:
        renderer.render_chat = lambda *_, **__: None  # shadows the method for the warm-up only
        try:
            return warmup(renderer, *args, **kwargs)
        finally:
            del renderer.render_chat

    BaseRenderer.warmup = without_chat
    try:
        yield
    finally:
        BaseRenderer.warmup = warmup


def _scalar_kernels_under_default_capability() -> None:
    """Under ``ATEN_CPU_CAPABILITY=default`` (how this project emulates other CPUs), let torch's compiler emit scalar
    code for the ops vLLM compiles: it would vectorize for the real CPU and include the headers of the emulated one,
    which lack the vector types, and the build fails (``'at::vec' has not been declared``; seen with torch 2.13)."""
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "default":
        import torch._inductor.config as inductor

        inductor.cpp.simdlen = 1


_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
#: The values this module put in the environment (so that a later engine replaces them, not the user's own).
_SET_BY_US: dict[str, str] = {}


def engine_environment(config: VLLMConfig) -> None:
    """The environment variables vLLM reads: an in-process engine, and the CPU KV cache (the user's value wins).

    ``VLLM_CPU_KVCACHE_SPACE`` set by the user before the first engine is kept; one this function set for an
    earlier engine of the process is replaced by this engine's ``cpu_kv_cache_gb``.

    Raises:
        ValueError: ``VLLM_CPU_KVCACHE_SPACE`` is set to something other than whole GiB (vLLM would fail on it with
            ``invalid literal for int()``).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in this process: no second copy, no re-imported script
    space = os.environ.get(_KV_SPACE)
    if space is None or space == _SET_BY_US.get(_KV_SPACE):  # not the user's: this engine's setting
        space = os.environ[_KV_SPACE] = _SET_BY_US[_KV_SPACE] = str(config.cpu_kv_cache_gb)
    if not space.strip().isdigit():
        raise ValueError(
            f"VLLM_CPU_KVCACHE_SPACE={space!r} in the environment is not valid: vLLM reads it as whole GiB (an "
            f"integer). Unset it to use VLLMConfig.cpu_kv_cache_gb (now {config.cpu_kv_cache_gb}), or set an "
            "integer such as 1"
        )


def build_llm(kwargs: dict[str, Any], config: VLLMConfig) -> Any:
    """``vllm.LLM(**kwargs)`` at ``config.log_level``, without its side effects and its chat-template warm-up.

    Raises:
        RuntimeError: vLLM failed (see :func:`_start_failure`).
    """
    _announce_start(kwargs)
    level = os.environ.get("VLLM_LOGGING_LEVEL", config.log_level).upper()
    _scalar_kernels_under_default_capability()
    try:
        with _contained_side_effects(), _vllm_log_level(level), _no_chat_template_warmup():
            from vllm import LLM

            return LLM(**kwargs, **_logging_arguments(level))
    except Exception as error:
        raise _start_failure(error, config, kwargs["max_model_len"]) from error


def _announce_start(kwargs: dict[str, Any]) -> None:
    """Say (rank zero) that the engine starts, what it does meanwhile and about how long it takes."""
    from lightning.fabric.utilities.rank_zero import rank_zero_info

    graphs = "" if kwargs.get("enforce_eager") else ", compiles and captures CUDA graphs (slower the first time)"
    rank_zero_info(
        f"vLLM engine: starting in this process (it loads the weights, sizes its KV cache{graphs}): a few seconds "
        "for a tiny model on a CPU, 30 s to a few minutes for a real model on a GPU"
    )


_MEMORY_SIGNS = ("out of memory", "memory", "kv cache", "cache blocks")


def _start_failure(error: Exception, config: VLLMConfig, max_model_len: int) -> RuntimeError:
    """The error to raise for ``error``: the memory settings to lower only when memory is what ran out."""
    text = str(error)
    reason = text if len(text) <= 600 else text[:600] + " ..."
    message = f"the vLLM engine failed to start ({type(error).__name__}: {reason})"
    if isinstance(error, torch.OutOfMemoryError) or any(sign in text.lower() for sign in _MEMORY_SIGNS):
        return RuntimeError(
            f"{message}. Memory ran out: lower vllm.gpu_memory_utilization (now {config.gpu_memory_utilization}) on "
            f"a GPU, vllm.cpu_kv_cache_gb (now {config.cpu_kv_cache_gb}) on CPU, or vllm.max_model_len (now "
            f"{max_model_len})"
        )
    return RuntimeError(
        f"{message}. vLLM's own traceback is chained above; vllm.log_level: INFO shows the engine's start-up report"
    )
