"""Import paths a config names (``lightning_grpo.rewards.math_answer``): the object they name, or why one fails.

A config names classes and functions by import path; :func:`imported` resolves one without raising, and
:func:`explain_import` says which part of a path that does not import fails and the closest name there.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any

__all__ = ["explain_import", "imported"]


def imported(path: str) -> Any:
    """The object at the import ``path`` (``package.module.Name``), or ``None`` when it cannot be imported."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def explain_import(path: str) -> str:
    """Which part of the import ``path`` fails and the closest name there, or ``""`` when it imports.

    Example::

        >>> explain_import("lightning_grpo.rewards.math_answr")  # doctest: +ELLIPSIS
        "cannot import it: 'lightning_grpo.rewards' has no 'math_answr'; did you mean '...rewards.math_answer'?"
    """
    parts = path.split(".")
    obj, found = None, 0
    for found in range(len(parts)):  # the longest prefix that imports as a module
        name = ".".join(parts[: found + 1])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:  # the module exists but imports a missing one
                return f"cannot import it: importing {name!r} failed: {error}"
            break
        except Exception as error:  # a module that fails to import: its own error is the cause
            return f"cannot import it: importing {name!r} failed: {type(error).__name__}: {error}"
    else:
        return ""
    for missing in range(found, len(parts)):  # then attributes
        if obj is None or not hasattr(obj, parts[missing]):
            return _missing(parts, missing, obj)
        obj = getattr(obj, parts[missing])
    return ""


def _missing(parts: Sequence[str], index: int, parent: Any) -> str:
    """The message for ``parts[index]`` missing from ``parent`` (``None``: no top-level module of that name)."""
    if parent is None:
        names = [module.name for module in pkgutil.iter_modules()]
        close = difflib.get_close_matches(parts[0], names, n=1, cutoff=0.7)
        hint = f"; did you mean {close[0]!r}?" if close else " (check the spelling and that it is on the Python path)"
        return f"cannot import it: no module named {parts[0]!r}{hint}"
    prefix = ".".join(parts[:index])
    names = [name for name in dir(parent) if not name.startswith("_")]
    if hasattr(parent, "__path__"):
        names += [module.name for module in pkgutil.iter_modules(parent.__path__)]
    close = difflib.get_close_matches(parts[index], names, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix + '.' + close[0]!r}?" if close else "; check the name."
    return f"cannot import it: {prefix!r} has no {parts[index]!r}{hint}"
