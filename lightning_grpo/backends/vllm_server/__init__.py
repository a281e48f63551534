"""The vLLM server backend (``rollout_backend: vllm_server``): rollouts sampled by a vLLM server on other GPUs.

``backend.py`` is the backend (:class:`VLLMServerBackend`: the adapter hot-loaded before each rollout, prompts sent
as token ids), ``settings.py`` its settings and the server's command line (:class:`VLLMServerConfig`), ``process.py``
the HTTP calls (``get_json``, ``post_json``, imported from there) and a server this package starts itself
(:class:`ServerProcess`), and ``launch.py`` the server's entry point (``python -m
lightning_grpo.backends.vllm_server.launch``, never imported by the package). Nothing here imports vLLM (docs/vllm.md,
"A vLLM server on other GPUs").
"""

from lightning_grpo.backends.vllm_server.backend import VLLMServerBackend, VLLMServerSession
from lightning_grpo.backends.vllm_server.process import ServerError, ServerProcess
from lightning_grpo.backends.vllm_server.settings import VLLMServerConfig, serve_command, start_hint

__all__ = [
    "ServerError",
    "ServerProcess",
    "VLLMServerBackend",
    "VLLMServerConfig",
    "VLLMServerSession",
    "serve_command",
    "start_hint",
]
