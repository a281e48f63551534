"""Moved: ``VLLMRollout`` is now :class:`lightning_grpo.backends.vllm.VLLMBackend` (the rollout backends' subpackage).

``VLLMRollout(config, grpo, policy, ...)`` became ``VLLMBackend(settings, BackendRun(grpo, policy, ...))``; the old
name still imports from here, with one ``DeprecationWarning`` naming the new path (:mod:`lightning_grpo._moved`).
"""

from lightning_grpo._moved import moved_names

__getattr__ = moved_names(__name__, {"VLLMRollout": "lightning_grpo.backends.vllm.VLLMBackend"})
