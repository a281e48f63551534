"""What the command line does with its arguments before the parser sees them.

``--debug`` is taken out (it keeps full messages and tracebacks), the working directory goes on the import path, and
two mistakes are refused in one line each, before a 50-line parser message could bury them: a subcommand without any
config or model, and a flat setting's old name (GRPOConfig's settings are grouped). Nothing here loads torch or
Lightning at import: ``lightning-grpo --help`` and ``lightning-grpo fit`` without a config answer before they load.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_grpo.cli.errors import DEBUG_ENV

__all__ = [
    "PACKAGED_CONFIG",
    "SUBCOMMANDS",
    "import_from_working_directory",
    "refuse_missing_config",
    "refuse_moved_settings",
    "without_debug_flag",
]

#: The demo's config, shipped in the package (a wheel has no configs/ folder); not imported: the demo runs this CLI.
PACKAGED_CONFIG = Path(__file__).resolve().parents[1] / "demo" / "tiny.yaml"
#: LightningCLI's subcommands (``demo`` runs before the command line: ``lightning_grpo.__main__``).
SUBCOMMANDS = ("fit", "validate", "test", "predict")
_NO_CONFIG = (
    "lightning-grpo {subcommand}: no model given. Pass a config, e.g. the demo's:\n"
    "  lightning-grpo {subcommand} --config {config}\n"
    "or set --model and --data on the command line ('lightning-grpo demo' runs that config)."
)


def without_debug_flag(args: Sequence[str] | None) -> list[str]:
    """The arguments (``sys.argv[1:]`` when ``args`` is ``None``) without ``--debug``, which sets
    ``LIGHTNING_GRPO_DEBUG=1``: full messages and tracebacks (docs/troubleshooting.md)."""
    argv = list(sys.argv[1:] if args is None else args)
    if "--debug" in argv:
        argv.remove("--debug")
        os.environ[DEBUG_ENV] = "1"
        if args is None:  # LightningCLI reads sys.argv itself
            sys.argv = [sys.argv[0], *argv]
    return argv


def import_from_working_directory() -> None:
    """Let configs name modules of the current folder (``examples.tool_calling.calc``), as ``python -m`` does.

    The ``lightning-grpo`` script's ``sys.path`` starts with the script's folder, not the working directory, so
    import paths of a project's own tools and reward functions would not resolve there (``docs/agents.md``).
    """
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def refuse_missing_config(argv: Sequence[str]) -> None:
    """Exit with status 2 (a usage error, as the parser's own) when a subcommand is given no config or model.

    Raises:
        SystemExit: The message shows how to pass a config (the demo's, shipped in the package).
    """
    if argv and argv[0] in SUBCOMMANDS and not any(_names_a_model(arg) for arg in argv[1:]):
        print(_NO_CONFIG.format(subcommand=argv[0], config=PACKAGED_CONFIG), file=sys.stderr)
        sys.exit(2)


def refuse_moved_settings(args: Any, prog: str | None) -> None:
    """Exit with one line (status 2, as a parser error) when ``args`` or a config they give hold a flat setting's old
    name (``--model.grpo.temperature``): before anything is parsed, as jsonargparse would report a union of subtypes.

    Raises:
        SystemExit: The line names the old key and its new place (``grpo.sampling.temperature``).
    """
    from lightning_grpo.cli.moved_settings import moved_setting  # reads GRPOConfig: loads torch

    found = moved_setting(args)
    if found is None:
        return
    listed = args if isinstance(args, (list, tuple)) else []
    subcommand = next((f" {arg}" for arg in listed if arg in SUBCOMMANDS), "")
    sys.stderr.write(f"{prog or Path(sys.argv[0]).name}{subcommand}: error: {found}\n")
    sys.exit(2)


def _names_a_model(arg: str) -> bool:
    """Whether a command-line argument gives a config, a model or asks for help (then the parser takes over)."""
    return arg in ("-c", "-h") or arg.startswith(("--config", "--model", "--help", "--print_config", "-c="))
