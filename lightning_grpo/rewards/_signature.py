"""Naming reward functions and matching their signatures to the keywords a batch offers."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KeywordSpec", "reward_name", "snake_case", "unique_names"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def snake_case(name: str) -> str:
    """``FormatReward`` -> ``format_reward``, ``HTTPScore`` -> ``http_score``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def reward_name(fn: Callable[..., Any]) -> str:
    """The name a reward function is reported under.

    The callable's ``name`` attribute if it is a non-empty string, else its ``__name__`` (``<lambda>`` reads
    ``lambda``; a ``functools.partial`` is named after the function it wraps), else its class name in snake_case.
    """
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(fn, functools.partial):
        return reward_name(fn.func)
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and name:
        return name.strip("<>")
    return snake_case(type(fn).__name__)


def unique_names(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` with repeats made unique by suffixes: ``[f, f, f]`` -> ``(f, f_1, f_2)``."""
    names = list(names)
    taken: set[str] = set(names)
    seen: set[str] = set()
    result = []
    for name in names:
        if name in seen:
            suffix = 1
            while f"{name}_{suffix}" in taken:
                suffix += 1
            name = f"{name}_{suffix}"
            taken.add(name)
        seen.add(name)
        result.append(name)
    return tuple(result)


@dataclass(frozen=True)
class KeywordSpec:
    """How a reward function is called, read once from its signature (see ``docs/rewards.md``).

    Reward functions are called by keyword, as TRL calls them: ``fn(prompts=..., completions=..., completion_ids=...,
    **columns, **extra)``. A function whose first two parameters are not both keywords the batch offers (today's
    positional form, e.g. ``lambda p, c, **kw``), or are positional-only, receives prompts and completions
    positionally instead, and the rest by keyword.

    Args:
        name: The reward name, for error messages.
        accepts_any: The function takes ``**kwargs`` (or its signature cannot be read): pass every keyword.
        readable: The signature could be read; unreadable ones are called positionally with every keyword.
        lead: Names of the first two positional parameters (fewer if the function has fewer).
        lead_positional_only: One of the ``lead`` parameters is positional-only.
        varargs: The function takes ``*args``.
        params: Keyword-capable parameter names, in order.
        required: Names in ``params`` without a default value.
    """

    name: str
    accepts_any: bool
    readable: bool = True
    lead: tuple[str, ...] = ()
    lead_positional_only: bool = False
    varargs: bool = False
    params: tuple[str, ...] = ()
    required: frozenset[str] = frozenset()

    @classmethod
    def of(cls, fn: Callable[..., Any], name: str) -> KeywordSpec:
        """Read ``fn``'s signature (no signature is refused: the keywords decide at call time)."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # some builtins and C callables have no readable signature
            return cls(name, accepts_any=True, readable=False)
        positional = [p for p in params if p.kind in _POSITIONAL][:2]
        keywords = [p for p in params if p.kind in _KEYWORD]
        return cls(
            name,
            accepts_any=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
            lead=tuple(p.name for p in positional),
            lead_positional_only=any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in positional),
            varargs=any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params),
            params=tuple(p.name for p in keywords),
            required=frozenset(p.name for p in keywords if p.default is inspect.Parameter.empty),
        )

    def positional(self, offered: Iterable[str]) -> bool:
        """Whether prompts and completions go positionally (today's form), given the keyword names on offer."""
        if not self.readable or self.lead_positional_only:
            return True
        if len(self.lead) < 2:
            return self.varargs and not self.lead  # ``def f(*args, **kw)``: the old positional form
        return "completions" not in self.lead and not set(self.lead) <= set(offered)

    def arguments(
        self, prompts: list[Any], completions: list[Any], keywords: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of one call.

        Raises:
            KeyError: Naming the required keywords the batch lacks (the caller turns it into a clear error).
        """
        offered = {"prompts": prompts, "completions": completions, **keywords}
        if self.positional(offered):
            args, taken, offered = (prompts, completions), set(self.lead), dict(keywords)
        else:
            args, taken = (), set()
        missing = sorted(self.required - taken - set(offered))
        if missing:
            raise KeyError(missing)
        if self.accepts_any:
            return args, {key: value for key, value in offered.items() if key not in taken}
        return args, {key: value for key, value in offered.items() if key in self.params and key not in taken}
