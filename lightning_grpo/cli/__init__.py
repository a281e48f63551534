"""The ``lightning-grpo`` command line (also ``python -m lightning_grpo``): :class:`GRPOCLI`, Lightning's
``LightningCLI`` for GRPO (:mod:`~lightning_grpo.cli.command`), its parser (:mod:`~lightning_grpo.cli.argument_parser`)
and what it checks before parsing (:mod:`~lightning_grpo.cli.argument_checks`) or building
(:mod:`~lightning_grpo.cli.config_checks`), the one-line errors of a bad setting (:mod:`~lightning_grpo.cli.errors`,
:mod:`~lightning_grpo.cli.misspelt_settings`, :mod:`~lightning_grpo.cli.moved_settings`,
:mod:`~lightning_grpo.cli.import_paths`), resuming a run (:mod:`~lightning_grpo.cli.resume`), what a fit prints at
its end (:mod:`~lightning_grpo.cli.summary`) and the help given without loading any library
(:mod:`~lightning_grpo.cli.static_help`).

The names below are imported when first used (PEP 562): ``lightning_grpo.cli.static_help`` loads no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static type checkers see; at run time __getattr__ imports each name when used
    from lightning_grpo.cli.command import GRPOCLI, main, parse_config
    from lightning_grpo.cli.misspelt_settings import misspelt_setting

#: Public name -> the module it is imported from when first used.
_EXPORTS = {
    "GRPOCLI": "lightning_grpo.cli.command",
    "main": "lightning_grpo.cli.command",
    "misspelt_setting": "lightning_grpo.cli.misspelt_settings",
    "parse_config": "lightning_grpo.cli.command",
}

__all__ = ["GRPOCLI", "main", "misspelt_setting", "parse_config"]


def __getattr__(name: str) -> Any:
    """Import a public name when it is first used."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the public ones not yet imported included."""
    return sorted({*globals(), *__all__})
