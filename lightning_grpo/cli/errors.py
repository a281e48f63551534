"""What the command line says about a bad setting: its full key, the value, why and the fix, in one line.

jsonargparse reports a bad value as a tree of union subtypes (``Parser key "model": ... Parser key "grpo": ...``)
after a 50-line usage dump, and a settings class refuses a value during instantiation, inside a chained traceback.
Here each becomes one line that starts with the key as a config writes it
(``model.init_args.grpo.objective.loss_agg_mode='token_mean': ...``). ``--debug`` (or ``LIGHTNING_GRPO_DEBUG=1``)
keeps the full message and traceback (docs/troubleshooting.md).

Beside it: a misspelt name (:mod:`~lightning_grpo.cli.misspelt_settings`), a flat setting's old name
(:mod:`~lightning_grpo.cli.moved_settings`), an import path that fails (:mod:`~lightning_grpo.cli.import_paths`) and
the values checked before anything is built (:mod:`~lightning_grpo.cli.config_checks`).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lightning_grpo.cli.import_paths import explain_import, imported
from lightning_grpo.settings_checks import SettingError

if TYPE_CHECKING:  # an annotation only: the command line reads DEBUG_ENV before it loads any library
    from jsonargparse import Namespace

__all__ = ["DEBUG_ENV", "DEBUG_HINT", "debug_enabled", "setting_key", "summarize_parse_error"]

#: The environment variable that keeps full messages and tracebacks (``--debug`` sets it).
DEBUG_ENV = "LIGHTNING_GRPO_DEBUG"
#: The line that follows a one-line error.
DEBUG_HINT = "(add --debug or set LIGHTNING_GRPO_DEBUG=1 for the full message and traceback)"
_KEY = re.compile(r'^(\s*)(?:- )?Parser key "([^"]+)":')  # "- Parser key": a dataclass's key in a union (4.39)
_CLASS = re.compile(r"^(\s*)- Problem with given class_path '([\w.]+)':")
_GOT = re.compile(r"\.?\s*Got value: (.*)$")
_STRUCTURE = (
    "Does not validate against",
    "Subtypes:",
    "Errors:",
    "Given value",
    "- Expected a <class 'NoneType'>",
    "- Expected a <class 'collections.abc.Mapping'>",
    "- Not a valid subclass",
    "Subclass types expect",
    "- a ",
)


def debug_enabled() -> bool:
    """Whether ``--debug`` or ``LIGHTNING_GRPO_DEBUG=1`` asked for full messages and tracebacks."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def summarize_parse_error(message: str) -> str | None:
    """One line for jsonargparse's error ``message``: the full key, the value, why and the fix; ``None`` if unknown.

    Example::

        >>> summarize_parse_error('Parser key "trainer.max_steps":\\n  Expected a <class \\'int\\'>. Got value: x')
        "trainer.max_steps='x': expected int; give a value of that type."
    """
    found = _deepest_key(message.splitlines())
    if found is None:
        return None
    key, leaf, given = found
    got = _GOT.search(leaf)
    value = got.group(1).strip() if got else None
    reason = _GOT.sub("", leaf).strip().lstrip("- ").strip()
    value = _class_path(value)
    if value is not None:
        key = _with_index(key, given, value)
    shown = f"{key}={value!r}" if value is not None else key
    return f"{shown}: {_explain(reason, value)}"


def _deepest_key(lines: Sequence[str]) -> tuple[str, str, str] | None:
    """The deepest ``Parser key`` of a message as a config key, its first error line and its ``Given value``."""
    stack: list[tuple[int, str, str]] = []  # (indent, "key" or "class", name)
    best: tuple[int, str, int] | None = None  # (depth, key, line index)
    for index, line in enumerate(lines):
        found = _KEY.match(line) or _CLASS.match(line)
        if not found:
            continue
        indent, kind = len(found.group(1)), "key" if found.re is _KEY else "class"
        stack = [entry for entry in stack if entry[0] < indent] + [(indent, kind, found.group(2))]
        if kind == "key":
            depth = sum(entry[1] == "key" for entry in stack)
            if best is None or depth > best[0]:
                best = (depth, _config_key(stack), index)
    if best is None:
        return None
    indent = len(lines[best[2]]) - len(lines[best[2]].lstrip())
    block = []
    for line in lines[best[2] + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line.strip())
    leaf = next((line for line in block if line and not line.startswith(_STRUCTURE)), block[0] if block else "")
    given = next((line for line in block if line.startswith("Given value:")), "")
    return best[1], leaf, given


def _config_key(stack: Sequence[tuple[int, str, str]]) -> str:
    """``model.init_args.grpo.x`` from the parser's nesting: ``init_args`` below a class, not below a dataclass."""
    parts = []
    for _, kind, name in stack:
        if kind == "key":
            parts.append(name)
        elif not dataclasses.is_dataclass(imported(name)):
            parts.append("init_args")
    return ".".join(parts)


def _class_path(value: str | None) -> str | None:
    """``Namespace(class_path='x')`` as ``x``; any other value unchanged."""
    found = re.fullmatch(r"Namespace\(class_path='([^']+)'.*\)", value or "")
    return found.group(1) if found else value


def _with_index(key: str, given: str, value: str) -> str:
    """``key[i]`` when the ``Given value`` is a list holding ``value`` at ``i`` (other items may be any repr)."""
    listed = re.fullmatch(r"\[(.*)\]", given.removeprefix("Given value:").strip())
    items = [item.strip().strip("'\"") for item in listed.group(1).split(",")] if listed else []
    return f"{key}[{items.index(value)}]" if value in items else key


def _explain(reason: str, value: str | None) -> str:
    """Why the value is refused and the fix, from jsonargparse's innermost error."""
    choices = re.search(r"Expected a typing\.Literal\[(.*)\]$", reason)
    if choices:
        options = [str(option) for option in ast.literal_eval(f"[{choices.group(1)}]")]
        close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else "use one of them."
        return f"not one of {', '.join(map(repr, options))}; {hint}"
    if value is not None and ("has no attribute" in reason or "No module named" in reason or "import" in reason):
        why = explain_import(value)
        if why:
            return why
    expected = re.fullmatch(r"Expected an? (.*)", reason)
    if expected:
        kind = re.sub(r"<class '([\w.]+)'>", r"\1", expected.group(1))
        return f"expected {kind}; give a value of that type."
    return f"{reason.rstrip('.')}; fix the value and run again."


def setting_key(config: Namespace, error: SettingError) -> str:
    """The key of the config (``model.init_args.grpo.sampling.num_generations``) that holds the setting ``error``
    refused."""
    parts = error.setting.split(".")
    tail = ".".join(parts[1:] if parts[0][:1].isupper() else parts)  # GRPOConfig.sampling.x: sampling.x
    parent, _, field = tail.rpartition(".")
    if parent:  # named with its group (sampling.num_generations, not validation's), or a key of a dict setting
        for key, value in config.items():
            if key == tail or key.endswith(f".{tail}"):
                return key
            if (key == parent or key.endswith(f".{parent}")) and isinstance(value, dict) and field in value:
                return f"{key}.{field}"
    leaves = [(key, value) for key, value in config.items() if key.rpartition(".")[2] == field]
    keys = [key for key, _ in leaves]
    same = [key for key, value in leaves if value == error.value]
    chosen = same or keys
    if not chosen:  # a key inside a dict setting (grpo.backend.rollout_backend_args: {gpu_memory_utilization: 2})
        chosen = [
            f"{key}.{field}"
            for key, value in config.items()
            if isinstance(value, dict) and field in value and value[field] == error.value
        ]
    return chosen[0] if chosen else error.setting
