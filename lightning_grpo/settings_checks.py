"""Checks of numeric settings, shared by every settings dataclass (``GRPOConfig``, ``PolicyConfig``, ...).

Each check raises an error that names the setting, the allowed range and the value given, so that a NaN, an
infinity or a string reaches the user as ``temperature must be a finite number > 0, got nan`` rather than as an
error deep inside torch or transformers. docs/troubleshooting.md lists the messages.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_number"]


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    integer: bool = False,
    allow_inf: bool = False,
    allow_none: bool = False,
) -> None:
    """Raise unless ``value`` is a number (an int if ``integer``) in the given range; NaN is always refused.

    Args:
        name: The setting's name as the user writes it (e.g. ``"kl_coef"`` or ``"policy.lora_r"``).
        value: The value to check.
        minimum: Lower bound, or ``None`` for none.
        maximum: Upper bound, or ``None`` for none.
        exclusive_minimum: The value must be strictly above ``minimum``.
        exclusive_maximum: The value must be strictly below ``maximum``.
        integer: Only ``int`` values (not ``bool``, not ``float``) are allowed.
        allow_inf: Allow ``+inf`` / ``-inf`` (when in range); otherwise the value must be finite.
        allow_none: Allow ``None`` (the setting is off).

    Raises:
        TypeError: ``value`` is not a number (or not an int when ``integer``).
        ValueError: ``value`` is NaN, infinite when that is not allowed, or out of range.

    Example::

        >>> check_number("kl_coef", 0.001, minimum=0)
        >>> check_number("kl_coef", float("nan"), minimum=0)
        Traceback (most recent call last):
        ...
        ValueError: kl_coef must be a finite number >= 0, got nan
        >>> check_number("num_generations", "8", integer=True, minimum=1)
        Traceback (most recent call last):
        ...
        TypeError: num_generations must be an integer >= 1, got '8' (str)
    """
    if value is None and allow_none:
        return
    kind = "an integer" if integer else ("a number" if allow_inf else "a finite number")
    bounds = _describe_bounds(minimum, maximum, exclusive_minimum, exclusive_maximum)
    wanted = f"{name} must be {kind}{bounds}{' or None' if allow_none else ''}"
    allowed = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise TypeError(f"{wanted}, got {value!r} ({type(value).__name__})")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise ValueError(f"{wanted}, got {value!r}")
    too_low = minimum is not None and (number <= minimum if exclusive_minimum else number < minimum)
    too_high = maximum is not None and (number >= maximum if exclusive_maximum else number > maximum)
    if too_low or too_high:
        raise ValueError(f"{wanted}, got {value!r}")


def _describe_bounds(
    minimum: float | None, maximum: float | None, exclusive_minimum: bool, exclusive_maximum: bool
) -> str:
    """`` >= 0``, `` in (0, 1]``, ... for the message."""
    if minimum is not None and maximum is not None:
        return f" in {'(' if exclusive_minimum else '['}{minimum}, {maximum}{')' if exclusive_maximum else ']'}"
    if minimum is not None:
        return f" {'>' if exclusive_minimum else '>='} {minimum}"
    if maximum is not None:
        return f" {'<' if exclusive_maximum else '<='} {maximum}"
    return ""
