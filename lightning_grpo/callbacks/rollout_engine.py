"""Moved to :mod:`lightning_grpo.callbacks.close_rollout_backend` (``CloseRolloutEngine`` is now
``CloseRolloutBackend``); this path still imports, with one ``DeprecationWarning`` naming the new path."""

from __future__ import annotations

import warnings
from typing import Any

from lightning_grpo.callbacks.close_rollout_backend import CloseRolloutBackend

_WARNED: list[bool] = []


def __getattr__(name: str) -> Any:
    """``CloseRolloutEngine``: :class:`CloseRolloutBackend`, with a ``DeprecationWarning`` the first time."""
    if name != "CloseRolloutEngine":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(f"{__name__}.CloseRolloutEngine moved to lightning_grpo.callbacks.close_rollout_backend."
                      "CloseRolloutBackend", DeprecationWarning, 2)  # fmt: skip
    return CloseRolloutBackend
