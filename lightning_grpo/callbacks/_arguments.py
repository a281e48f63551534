"""The argument checks the callbacks' ``__init__`` share: an error that names the allowed values."""

from __future__ import annotations

from typing import Any

from lightning_grpo.settings_checks import check_number

__all__ = ["check_positive_int", "check_prefix"]


def check_prefix(prefix: Any) -> str:
    """``prefix`` if it is a string, else a ``TypeError``."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string such as 'train/', got {prefix!r} ({type(prefix).__name__})")
    return prefix


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """``value`` if it is an int >= 1 (or ``None`` when allowed), else a ``ValueError`` naming the allowed values."""
    check_number(name, value, integer=True, minimum=1, allow_none=allow_none)
    return value
