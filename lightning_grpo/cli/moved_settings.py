"""A flat setting's old name (GRPOConfig's settings are grouped) in command-line arguments or the configs they give.

:func:`moved_setting` finds the first one before anything is parsed and names its new place in one line; the command
line refuses the run with it (:func:`~lightning_grpo.cli.argument_checks.refuse_moved_settings`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lightning_grpo.config import MOVED_SETTINGS, moved_setting_message

__all__ = ["moved_setting"]

#: A command-line flag that sets one GRPOConfig setting: ``--model.grpo.<name>`` (``init_args`` where a config has it).
_GRPO_FLAG = re.compile(r"--(model\.(?:init_args\.)?grpo\.(?:init_args\.)?)(\w+)(?=$|[.=])")
#: Command-line flags whose value is a config (a file or inline YAML), and where in it the module's settings are.
_CONFIG_FLAGS = {"--config": "root", "-c": "root", "--model": "model", "--model.init_args": "init_args"}
_CONFIG_FLAGS |= {"--model.grpo": "grpo", "--model.init_args.grpo": "grpo"}


def moved_setting(args: Sequence[str] | dict[str, Any] | None) -> str | None:
    """The line for the first flat setting's old name in command-line ``args`` or the configs they give, or ``None``.

    GRPOConfig's settings are grouped (``grpo.sampling.temperature``, docs/configuration.md); an old flat key, as a
    flag (``--model.grpo.temperature=0.5``) or in a config (``model: init_args: grpo: temperature: 0.5`` in a
    ``--config`` file), is named with its new place before anything is parsed: jsonargparse would report it as a
    union of subtypes. A config that cannot be read is left to the parser.

    Example::

        >>> moved_setting(["fit", "--model.grpo.temperature=0.5"])  # doctest: +ELLIPSIS
        '--model.grpo.temperature moved to --model.grpo.sampling.temperature (settings are grouped: docs/...)'
    """
    if isinstance(args, dict):
        return _moved_in_config(args, "--config", "")
    args = list(args or [])
    for index, arg in enumerate(args):
        flag = _GRPO_FLAG.match(arg)
        if flag and flag.group(2) in MOVED_SETTINGS:
            return moved_setting_message(flag.group(2), prefix=f"--{flag.group(1)}")
        name, has_value, value = arg.partition("=")
        if name not in _CONFIG_FLAGS or (not has_value and index + 1 == len(args)):
            continue
        value = value if has_value else args[index + 1]
        found = _moved_in_config(_read_config(value), name, value if _is_file(value) else "")
        if found:
            return found
    return None


def _is_file(value: str) -> bool:
    try:
        return os.path.isfile(value)
    except (OSError, ValueError):
        return False


def _read_config(value: str) -> Any:
    """The YAML (or JSON) of the file ``value``, else of ``value`` itself; ``None`` when it does not load."""
    try:
        text = Path(value).read_text(encoding="utf-8") if _is_file(value) else value
        return yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _moved_in_config(data: Any, flag: str, source: str) -> str | None:
    """The line for the first flat setting's old name in the config ``data`` given to ``flag``, from the file
    ``source`` (``""``: inline). ``--config`` gives the subcommand's config or the whole command's (``fit: model:``)."""
    level = _CONFIG_FLAGS[flag]
    if level == "grpo":
        found = _moved_in_grpo(data, f"{flag.removeprefix('--')}.")
    elif level == "init_args":
        found = _moved_in_grpo(_get(data, "grpo"), "model.init_args.grpo.")
    elif level == "model":
        found = _moved_in_model(data, "model.")
    else:
        roots = [(data, "")] + [(_get(data, name), f"{name}.") for name in ("fit", "validate", "test", "predict")]
        found = next((f for node, at in roots if (f := _moved_in_model(_get(node, "model"), f"{at}model."))), None)
    return f"{source}: {found}" if found and source else found


def _moved_in_model(model: Any, prefix: str) -> str | None:
    found = _moved_in_grpo(_get(_get(model, "init_args"), "grpo"), f"{prefix}init_args.grpo.")
    return found or _moved_in_grpo(_get(model, "grpo"), f"{prefix}grpo.")


def _moved_in_grpo(grpo: Any, prefix: str) -> str | None:
    if isinstance(grpo, dict) and isinstance(grpo.get("init_args"), dict):  # grpo given by class_path
        grpo, prefix = grpo["init_args"], f"{prefix}init_args."
    if not isinstance(grpo, dict):
        return None
    name = next((key for key in grpo if key in MOVED_SETTINGS), None)
    return None if name is None else moved_setting_message(name, prefix=prefix)


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else None
