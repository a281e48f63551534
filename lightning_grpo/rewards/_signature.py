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
    """Which keywords a reward function accepts and requires, read once from its signature.

    Args:
        name: The reward name, for error messages.
        accepts_any: The function takes ``**kwargs`` (or its signature cannot be read): pass every keyword.
        accepted: Keyword names the signature accepts (the first two positional parameters excluded).
        required: Accepted names without a default value.
    """

    name: str
    accepts_any: bool
    accepted: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()

    @classmethod
    def of(cls, fn: Callable[..., Any], name: str) -> KeywordSpec:
        """Read ``fn``'s signature; raise ``TypeError`` if it cannot take ``(prompts, completions)``."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # some builtins and C callables have no readable signature
            return cls(name, accepts_any=True)
        positional = [p for p in params if p.kind in _POSITIONAL]
        takes_varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        if len(positional) < 2 and not takes_varargs:
            raise TypeError(
                f"reward function {name!r} must accept (prompts, completions, **columns); "
                f"its signature is {inspect.signature(fn)}"
            )
        bound = {p.name for p in positional[:2]}
        keywords = [p for p in params if p.kind in _KEYWORD and p.name not in bound]
        return cls(
            name,
            accepts_any=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
            accepted=frozenset(p.name for p in keywords),
            required=frozenset(p.name for p in keywords if p.default is inspect.Parameter.empty),
        )

    def missing(self, keywords: Mapping[str, Any]) -> list[str]:
        """Required keyword names that ``keywords`` lacks, sorted."""
        return sorted(self.required - set(keywords))

    def select(self, keywords: Mapping[str, Any]) -> dict[str, Any]:
        """The keywords to pass: all of them if the function takes ``**kwargs``, else those it names."""
        if self.accepts_any:
            return dict(keywords)
        return {key: value for key, value in keywords.items() if key in self.accepted}
