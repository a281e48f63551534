"""Checks of numeric settings, shared by every settings dataclass (``GRPOConfig``, ``PolicyConfig``, ...).

Each check raises an error that names the setting, the allowed range and the value given, so that a NaN, an
infinity or a string reaches the user as ``temperature must be a finite number > 0, got nan`` rather than as an
error deep inside torch or transformers. docs/troubleshooting.md lists the messages.

The errors are :class:`SettingError` (a ``ValueError``; :class:`SettingTypeError` is also a ``TypeError``): they
carry the setting's name and value, so that a settings class names itself (``GRPOConfig.sampling.num_generations=1:
...``, :func:`named_errors`) and the command line names the full key of the config
(``model.init_args.grpo.sampling.num_generations``).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["SettingError", "SettingTypeError", "check_choice", "check_number", "literal_choices", "named_errors"]


class SettingError(ValueError):
    """A refused setting value. The message starts with the setting's name, then says why and what to give.

    Args:
        message: The whole message; it starts with ``setting`` (``"kl_coef must be a finite number >= 0, got -1"``).
        setting: The setting's name as the message starts with it (``"kl_coef"``, ``"policy.lora_r"``).
        value: The value that was refused.
    """

    def __init__(self, message: str, setting: str, value: Any) -> None:
        super().__init__(message)
        self.setting = setting
        self.value = value

    def renamed(self, name: str) -> SettingError:
        """The same error, its message starting with ``name`` (``GRPOConfig.objective.kl_coef``, a config key)
        instead."""
        message = str(self)
        owned = re.match(r"[A-Z]\w*(?:\.\w+)+", message)  # the setting named with its owner: GRPOConfig.sampling.x
        if message.startswith(self.setting):
            message = name + message[len(self.setting) :]
        elif owned and owned.group().endswith(f".{self.setting}"):
            message = name + message[owned.end() :]
        else:
            message = f"{name}={self.value!r}: {message}"
        return type(self)(message, name, self.value)


class SettingTypeError(SettingError, TypeError):
    """A setting value of the wrong type (also a ``TypeError``)."""


@contextmanager
def named_errors(settings: Any, owner: str | None = None) -> Iterator[None]:
    """Errors raised inside that start with a field of the dataclass ``settings`` name its class (or ``owner``,
    e.g. ``GRPOConfig.sampling`` for a group of settings) first.

    ``num_generations=1: ...`` becomes :class:`SettingError` ``GRPOConfig.sampling.num_generations=1: ...`` (a
    ``TypeError`` stays one too); other errors pass unchanged.

    Example::

        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Settings:
        ...     rate: float = 1.0
        ...     def __post_init__(self):
        ...         with named_errors(self):
        ...             check_number("rate", self.rate, minimum=0)
        >>> Settings(rate=-1.0)
        Traceback (most recent call last):
        ...
        lightning_grpo.settings_checks.SettingError: Settings.rate must be a finite number >= 0, got -1.0
    """
    try:
        yield
    except (ValueError, TypeError) as error:
        named = _named(error, settings, owner)
        if named is error:
            raise
        raise named from None


def _named(error: Exception, settings: Any, owner: str | None = None) -> Exception:
    """``error`` as a :class:`SettingError` naming ``owner`` (the class of ``settings`` by default), or ``error`` if
    no field starts it."""
    owner = owner or type(settings).__name__
    if isinstance(error, SettingError):
        setting, value = error.setting, error.value
    else:
        found = re.match(r"\w+", str(error))
        names = {field.name for field in fields(settings)} if is_dataclass(settings) else set()
        if not found or found.group() not in names:
            return error
        setting, value = found.group(), getattr(settings, found.group())
    if setting.startswith(f"{owner}."):
        return error
    kind = SettingTypeError if isinstance(error, TypeError) else SettingError
    return kind(str(error), setting, value).renamed(f"{owner}.{setting}")


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
        SettingTypeError: ``value`` is not a number (or not an int when ``integer``); also a ``TypeError``.
        SettingError: ``value`` is NaN, infinite when that is not allowed, or out of range; a ``ValueError``.

    Example::

        >>> check_number("kl_coef", 0.001, minimum=0)
        >>> check_number("kl_coef", float("nan"), minimum=0)
        Traceback (most recent call last):
        ...
        lightning_grpo.settings_checks.SettingError: kl_coef must be a finite number >= 0, got nan
        >>> check_number("num_generations", "8", integer=True, minimum=1)
        Traceback (most recent call last):
        ...
        lightning_grpo.settings_checks.SettingTypeError: num_generations must be an integer >= 1, got '8' (str)
    """
    if value is None and allow_none:
        return
    kind = "an integer" if integer else ("a number" if allow_inf else "a finite number")
    bounds = _describe_bounds(minimum, maximum, exclusive_minimum, exclusive_maximum)
    wanted = f"{name} must be {kind}{bounds}{' or None' if allow_none else ''}"
    allowed = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise SettingTypeError(f"{wanted}, got {value!r} ({type(value).__name__})", name, value)
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise SettingError(f"{wanted}, got {value!r}", name, value)
    too_low = minimum is not None and (number <= minimum if exclusive_minimum else number < minimum)
    too_high = maximum is not None and (number >= maximum if exclusive_maximum else number > maximum)
    if too_low or too_high:
        raise SettingError(f"{wanted}, got {value!r}", name, value)


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


def literal_choices(settings_class: type) -> dict[str, tuple[Any, ...]]:
    """The allowed values of each field of ``settings_class`` typed by ``Literal`` (with ``bool`` or ``None`` too).

    Fields whose type also admits other values (an import path, a free string) are left out: they are open.

    Example::

        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Settings:
        ...     mode: Literal["sum", "last"] | None = "sum"
        ...     name: str = "x"
        >>> literal_choices(Settings)
        {'mode': ('sum', 'last', None)}
    """
    choices = {}
    for name, hint in get_type_hints(settings_class).items():
        members = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
        literals = [member for member in members if get_origin(member) is Literal]
        if literals and all(get_origin(m) is Literal or m in (bool, type(None)) for m in members):
            extra = ((True, False) if bool in members else ()) + ((None,) if type(None) in members else ())
            choices[name] = tuple(value for literal in literals for value in get_args(literal)) + extra
    return choices


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Raise :class:`SettingError` ``name='x' is not valid; choose one of 'a', 'b'`` unless ``value`` is a choice.

    Example::

        >>> check_choice("env_reward", "mean", ("sum", "last"))
        Traceback (most recent call last):
        ...
        lightning_grpo.settings_checks.SettingError: env_reward='mean' is not valid; choose one of 'sum', 'last'
    """
    if not any(value == choice and type(value) is type(choice) for choice in choices):
        options = ", ".join(repr(choice) for choice in choices)
        raise SettingError(f"{name}={value!r} is not valid; choose one of {options}", name, value)
