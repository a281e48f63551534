"""Rollout backends: what samples a run's rollouts, behind one :class:`RolloutBackend` interface.

``rollout_backend: hf`` (the default, :class:`HFBackend`: Hugging Face ``generate`` or our own decoding loop),
``rollout_backend: vllm`` (:class:`VLLMBackend`: a colocated vLLM engine, ``docs/vllm.md``), ``rollout_backend:
vllm_server`` (:class:`VLLMServerBackend`: a vLLM server on other GPUs or machines), or the import path of
a user's own class with its settings in ``rollout_backend_args`` (``docs/backends.md``). Nothing here imports vLLM
until a vLLM engine starts.
"""

from lightning_grpo.backends.build import BACKENDS, backend_class, build_backend
from lightning_grpo.backends.hf import HFBackend, HFSession
from lightning_grpo.backends.protocol import OPTIONAL_SETTINGS, BackendSpec, RolloutBackend, RolloutSession
from lightning_grpo.backends.vllm.backend import VLLMBackend, VLLMSession
from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.backends.vllm_server.backend import VLLMServerBackend, VLLMServerSession
from lightning_grpo.backends.vllm_server.settings import VLLMServerConfig

__all__ = [
    "BACKENDS",
    "OPTIONAL_SETTINGS",
    "BackendSpec",
    "HFBackend",
    "HFSession",
    "RolloutBackend",
    "RolloutSession",
    "VLLMBackend",
    "VLLMConfig",
    "VLLMServerBackend",
    "VLLMServerConfig",
    "VLLMServerSession",
    "VLLMSession",
    "backend_class",
    "build_backend",
]
