"""Settings of the vLLM server backend (``rollout_backend: vllm_server``) and the server's command line.

Nothing here imports vLLM: the trainer talks to the server over HTTP, so the trainer's machine needs vLLM only when
the backend starts the server itself (``start: true``). docs/vllm.md, "A vLLM server on other GPUs".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from lightning_grpo.settings_checks import check_number

__all__ = ["VLLMServerConfig", "serve_command", "start_hint"]

_PREFIX = "GRPOConfig.backend.rollout_backend_args"


@dataclass
class VLLMServerConfig:
    """Where the vLLM server is, or how to start one, and how the trainer talks to it."""

    url: str | None = None
    """The server's base URL, e.g. ``http://10.0.0.5:8000`` (without ``/v1``). Exactly one of ``url`` and ``start``."""
    start: bool = False
    """Start ``vllm serve <the run's model>`` as a subprocess on 127.0.0.1 (a free port), for a one-machine run; it is
    stopped (with its engine process) at the end of fit, on an exception and at interpreter exit."""
    adapter_dir: str | None = None
    """A folder the server reads too: rank 0 writes each version's adapter there (a shared file system when the
    server is on another machine); ``None``: a new temporary folder (trainer and server on one machine)."""
    request_timeout_s: float = 600.0
    """Seconds one HTTP request may take (a completion request waits for all its samples); a request that times out
    is sent once more, then the run stops with an error naming this setting."""
    start_timeout_s: float = 600.0
    """``start: true``: seconds to wait for the started server to answer."""
    max_concurrent_requests: int = 64
    """Requests in flight at once (one per prompt, its G samples in it): the server batches what is in flight."""
    max_lora_rank: int | None = None
    """``start: true``: the server's ``--max-lora-rank``; ``None``: the smallest of vLLM's ranks that holds
    ``policy.lora_r``."""
    max_model_len: int | None = None
    """``start: true``: the server's ``--max-model-len``; ``None``: ``max_prompt_length + max_new_tokens``."""
    cpu_kv_cache_gb: int = 1
    """``start: true`` on a CPU build: the server's KV cache in whole GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    cpu_threads: int | None = None
    """``start: true`` on a CPU build: the server's OpenMP threads (``OMP_NUM_THREADS``; vLLM's own thread binding is
    off then, ``VLLM_CPU_OMP_THREADS_BIND=nobind``), so that server and trainer share few cores without contention;
    ``None``: vLLM's default (it binds all cores)."""
    extra_args: list[str] = field(default_factory=list)
    """``start: true``: more arguments for ``vllm serve`` (e.g. ``["--gpu-memory-utilization", "0.9"]``)."""

    def __post_init__(self) -> None:
        if (self.url is None) == (not self.start):
            raise ValueError(
                f"{_PREFIX}: give exactly one of url (a running server, e.g. url: http://127.0.0.1:8000) and "
                f"start: true (the backend starts one); got url={self.url!r}, start={self.start!r}"
            )
        if self.url is not None and not (isinstance(self.url, str) and self.url.startswith(("http://", "https://"))):
            raise ValueError(f"{_PREFIX}.url={self.url!r} is not valid; give an http:// or https:// URL")
        if self.url is not None:
            self.url = self.url.rstrip("/").removesuffix("/v1")
        for name in ("request_timeout_s", "start_timeout_s"):
            check_number(f"{_PREFIX}.{name}", getattr(self, name), minimum=0.0, exclusive_minimum=True)
        check_number(f"{_PREFIX}.max_concurrent_requests", self.max_concurrent_requests, integer=True, minimum=1)
        check_number(f"{_PREFIX}.max_model_len", self.max_model_len, integer=True, minimum=1, allow_none=True)
        check_number(f"{_PREFIX}.cpu_kv_cache_gb", self.cpu_kv_cache_gb, integer=True, minimum=1)
        check_number(f"{_PREFIX}.cpu_threads", self.cpu_threads, integer=True, minimum=1, allow_none=True)
        if not isinstance(self.extra_args, list) or not all(isinstance(a, str) for a in self.extra_args):
            raise TypeError(f"{_PREFIX}.extra_args must be a list of strings, got {self.extra_args!r}")


def serve_command(
    model: str,
    *,
    port: int,
    lora_rank: int,
    max_model_len: int,
    dtype: str = "auto",
    seed: int = 0,
    host: str = "127.0.0.1",
    max_logprobs: int = 20,
    extra_args: list[str] | None = None,
) -> list[str]:
    """The arguments of ``vllm serve`` for this run (after ``vllm serve``): the model, LoRA on with the policy's rank,
    the processed log-probs (those of the distribution sampled from) and as many per token as the run's top-k needs
    (``max_logprobs``), the engine's defaults instead of the model's ``generation_config.json``."""
    options = {  # an option's value, None for a flag
        "--host": host,
        "--port": str(port),
        "--enable-lora": None,
        "--max-lora-rank": str(lora_rank),
        "--logprobs-mode": "processed_logprobs",
        "--max-model-len": str(max_model_len),
        "--dtype": dtype,
        "--seed": str(seed),
        "--generation-config": "vllm",
        "--max-logprobs": str(max_logprobs),
    }
    words = [word for option, value in options.items() for word in (option, value) if word is not None]
    return [model, *words, *(extra_args or [])]


def start_hint(model: str | None, *, lora_rank: int, max_model_len: int, max_logprobs: int = 20) -> str:
    """How to start a server this run can use: the exact command line, for an error message."""
    args = serve_command(
        model or "<the run's model>",
        port=8000,
        lora_rank=lora_rank,
        max_model_len=max_model_len,
        host="0.0.0.0",
        max_logprobs=max_logprobs,
    )
    line = shlex.join(args)
    return (
        f"start one with: VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 vllm serve {line} (with vllm-cpu, whose `vllm` command "
        f"fails: VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 python -m vllm.entrypoints.openai.api_server --model {line}), "
        "then set rollout_backend_args.url to http://<its host>:8000; or set rollout_backend_args.start: true to "
        "let the backend start one on this machine (docs/vllm.md, A vLLM server on other GPUs)"
    )
