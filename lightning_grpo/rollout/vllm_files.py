"""Moved to :mod:`lightning_grpo.backends.vllm_files`; this path still imports, with one
``DeprecationWarning`` naming the new path."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_NEW = "lightning_grpo.backends.vllm_files"  # imported by name when first used (a layer above)
_WARNED: list[bool] = []


def __getattr__(name: str) -> Any:
    """A name of the new module, with a ``DeprecationWarning`` on the first one taken from here."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_NEW), name)
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(f"{__name__} moved to {_NEW}; import {name} from there", DeprecationWarning, 2)
    return value
