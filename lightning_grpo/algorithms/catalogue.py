"""Open catalogues: a variant is a built-in name or the import path of a function written anywhere.

The policy losses, advantage estimators and KL estimators are each a read-only catalogue of built-in functions
sharing one signature. A name that is not in the catalogue but reads as an import path
(``my_project.losses.my_loss``) is imported, the way LightningCLI names classes, so a user's own variant is chosen
from ``GRPOConfig`` or YAML exactly like a built-in, without editing this package (docs/index.md, "Add your own loss").

Import paths rather than a registry: a config stays plain data (a string in YAML, in ``--print_config`` and in the
checkpoint's hyperparameters); nothing has to run before a config is read, so every DDP or FSDP process, a resumed
run and ``lightning-grpo fit`` on another machine all find the same function; and no global state can differ
between processes or depend on import order.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import TypeVar, cast

__all__ = ["IMPORT_PATH_PATTERN", "choose", "is_import_path"]

T = TypeVar("T")

#: A dotted import path: a module path and a name in it (at least one dot).
IMPORT_PATH_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$"
_EXAMPLE = "or the import path of a function such as 'my_project.losses.my_loss'"


def is_import_path(name: object) -> bool:
    """Whether ``name`` reads as a dotted import path (``package.module.function``).

    Example::

        >>> is_import_path("my_project.losses.my_loss"), is_import_path("clip")
        (True, False)
    """
    return isinstance(name, str) and re.fullmatch(IMPORT_PATH_PATTERN, name) is not None


def choose(catalogue: Mapping[str, T], name: str, what: str, *, import_paths: bool = False) -> T:
    """Look ``name`` up in a catalogue; with ``import_paths``, import it if it is not a built-in name.

    Args:
        catalogue: Built-in name to function.
        name: The requested variant: a built-in name, or (with ``import_paths``) ``"package.module.function"``.
        what: What is being chosen, for the message (e.g. ``"advantage estimator"``).
        import_paths: Whether the catalogue is open to functions named by import path.

    Raises:
        ValueError: ``name`` is neither a built-in name nor (when allowed) an importable callable; the message
            lists the valid names.

    Example::

        >>> choose({"double": lambda x: 2 * x}, "double", "doubler")(3)
        6
        >>> choose({}, "math.sqrt", "root", import_paths=True)(9.0)
        3.0
    """
    try:
        return catalogue[name]
    except (KeyError, TypeError):
        pass
    valid = ", ".join(repr(k) for k in catalogue) + (f", {_EXAMPLE}" if import_paths else "")
    if not (import_paths and is_import_path(name)):
        raise ValueError(f"unknown {what} {name!r}; valid names: {valid}")
    module_name, attribute = name.rsplit(".", 1)
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import the {what} {name!r} ({error}); valid names: {valid}") from None
    if not callable(function):
        raise ValueError(f"the {what} {name!r} is not callable (got {type(function).__name__}); valid names: {valid}")
    return cast(T, function)  # of the catalogue's signature, by the user's word
