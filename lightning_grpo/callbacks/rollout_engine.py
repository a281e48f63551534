"""Moved: ``CloseRolloutEngine`` is now :class:`lightning_grpo.callbacks.close_rollout_backend.CloseRolloutBackend`.

The old name still imports from here, with one ``DeprecationWarning`` naming the new path
(:mod:`lightning_grpo._moved`).
"""

from lightning_grpo._moved import moved_names

__getattr__ = moved_names(
    __name__, {"CloseRolloutEngine": "lightning_grpo.callbacks.close_rollout_backend.CloseRolloutBackend"}
)
