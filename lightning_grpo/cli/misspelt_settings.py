"""An unknown setting in a parser message, named with the closest valid name (``did you mean 'num_generations'?``).

jsonargparse refuses a misspelt key or flag somewhere inside a nested message; :func:`misspelt_setting` finds the
name, the class whose settings it was meant for, and that class's closest setting, in one line. A flat setting's old
name (GRPOConfig's settings are grouped) is named with its new place instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from collections.abc import Sequence

from lightning_grpo.cli.import_paths import imported
from lightning_grpo.config import GROUPS, MOVED_SETTINGS, moved_setting_message

__all__ = ["misspelt_setting"]

#: An unknown setting in a parser message (jsonargparse's wordings since 4.39): ``Option 'x' is not accepted``,
#: ``Key 'x' is not expected``, ``Group 'g' does not accept option 'x'`` (or ``nested key``: a YAML key in a group of
#: settings), ``unrecognized arguments: --g.x=1`` (a flag).
_UNKNOWN = re.compile(
    r"Option '([\w.]+)' is not accepted|Key '([\w.]+)' is not expected|Group '([\w.]+)' does not accept "
    r"(?:option|nested key) '([\w.]+)'|unrecognized arguments: --(\S+)",
    flags=re.IGNORECASE,
)
#: What a nested message is about: a class given by ``class_path``, or the types of a union (a dataclass's settings).
_CONTEXT = re.compile(r"class_path '([\w.]+)':|Subtypes: \[(.*)\]")


def misspelt_setting(message: str, options: Sequence[str]) -> str | None:
    """A one-line summary of an unknown setting in a parser ``message``, with the closest valid name, or ``None``.

    Args:
        message: The parser's error message.
        options: The parser's option strings (``--trainer.max_steps``, ...), for unknown command-line arguments.

    Example::

        >>> misspelt_setting("unrecognized arguments: --trainer.max_step 3", ["--trainer.max_steps"])
        "unknown setting 'trainer.max_step': did you mean 'trainer.max_steps'? Fix the name and run again."
    """
    found = _UNKNOWN.search(message)
    if not found:
        return None
    option, key, group, group_option, argument = found.groups()
    name = option or key or (f"{group}.{group_option}" if group else argument.split("=")[0])
    cls = _settings_class(message[: found.start()])
    if cls is None:  # a key of the command line's own parser
        return _suggest(name, [o.lstrip("-") for o in options if o.startswith("--")], "")
    if name in MOVED_SETTINGS and _is_grpo_config(cls):  # an old flat name the command line did not see first
        return moved_setting_message(name)
    return _suggest(name, _parameters(cls), f" of {cls}")


def _settings_class(before: str) -> str | None:
    """The import path of the class whose settings the message ``before`` an unknown name is about, or ``None``."""
    contexts = list(_CONTEXT.finditer(before))
    if not contexts:
        return None
    path, union = contexts[-1].groups()
    if path is None:
        path = next((c for c in re.findall(r"<class '([\w.]+)'>", union) if c != "NoneType" and imported(c)), None)
    return None if path is None else _public_path(path)


def _public_path(path: str) -> str:
    """``lightning_grpo.GRPOConfig`` for ``lightning_grpo.config.grpo.GRPOConfig``: the package's own name for it."""
    package, name = path.partition(".")[0], path.rpartition(".")[2]
    return f"{package}.{name}" if imported(f"{package}.{name}") is imported(path) is not None else path


def _suggest(name: str, valid: Sequence[str], where: str) -> str:
    """The closest of the ``valid`` names (``group.name`` for a setting in a group: a name alone matches it too)."""
    aliases = {name: name for name in valid}
    for full in valid:
        aliases.setdefault(full.rpartition(".")[2], full)
    same = [full for full in valid if "." in name and full.rpartition(".")[2] == name.rpartition(".")[2]]
    close = same[:1] or difflib.get_close_matches(name, list(aliases), n=1, cutoff=0.6)
    hint = f"did you mean {aliases[close[0]]!r}?" if close else f"valid names: {', '.join(sorted(valid)[:12])}"
    return f"unknown setting {name!r}{where}: {hint} Fix the name and run again."


def _parameters(path: str) -> list[str]:
    """The keyword parameters of the class at import ``path`` (its dataclass fields or ``__init__`` arguments); a
    group of settings (a field that is a dataclass, as ``GRPOConfig.sampling``) gives ``group.name`` for each."""
    cls = imported(path)
    if dataclasses.is_dataclass(cls):
        names = []
        for field in dataclasses.fields(cls):
            group = field.default_factory
            if isinstance(group, type) and dataclasses.is_dataclass(group):
                names += [f"{field.name}.{inner.name}" for inner in dataclasses.fields(group)]
            else:
                names.append(field.name)
        return names
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _is_grpo_config(path: str) -> bool:
    """Whether the import ``path`` names :class:`~lightning_grpo.GRPOConfig` (or a subclass of it)."""
    cls = imported(path)
    return isinstance(cls, type) and dataclasses.is_dataclass(cls) and set(GROUPS) <= set(cls.__dataclass_fields__)
