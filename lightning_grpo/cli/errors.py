"""What the command line says about a bad setting: its full key, the value, why and the fix, in one line.

jsonargparse reports a bad value as a tree of union subtypes (``Parser key "model": ... Parser key "grpo": ...``)
after a 50-line usage dump; a settings class refuses a value during instantiation, inside a chained traceback; and
torch refuses an optimizer's learning rate only when the model is built. Here each becomes one line that starts with
the key as a config writes it (``model.init_args.grpo.objective.loss_agg_mode='token_mean': ...``). ``--debug`` (or
``LIGHTNING_GRPO_DEBUG=1``) keeps the full message and traceback (docs/troubleshooting.md).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
import os
import pkgutil
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace

from lightning_grpo.config import GROUPS, MOVED_SETTINGS, moved_setting_message
from lightning_grpo.settings_checks import SettingError

__all__ = [
    "DEBUG_HINT",
    "check_optimizers",
    "debug_enabled",
    "explain_import",
    "imported",
    "misspelt_setting",
    "moved_setting",
    "setting_key",
    "summarize_parse_error",
]

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


def check_optimizers(config: Namespace) -> None:
    """Build every torch optimizer of ``config`` over one dummy parameter, so a bad value fails before the model.

    Raises:
        SettingError: An optimizer refused a value; the message names its key (``...optimizer.init_args.lr``).
    """
    for key, settings in _class_namespaces(config):
        cls = imported(str(settings.get("class_path")))
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        arguments = settings.get("init_args")
        arguments = arguments.as_dict() if isinstance(arguments, Namespace) else {}
        try:
            cls([torch.nn.Parameter(torch.zeros(1))], **arguments)
        except ValueError as error:
            raise _optimizer_error(f"{key}.init_args", str(settings.get("class_path")), arguments, error) from None
        except Exception:  # an optimizer that needs more than parameters: it reports its own errors later
            continue


def _class_namespaces(config: Namespace) -> list[tuple[str, Namespace]]:
    """``(key, namespace)`` of every namespace of ``config`` that names a ``class_path``."""
    found = []
    for key, value in config.items():
        if key.endswith("class_path") and isinstance(value, str):
            parent = key.rpartition(".")[0]
            found.append((parent, config.get(parent) if parent else config))
    return found


def _optimizer_error(key: str, cls: str, arguments: dict[str, Any], error: ValueError) -> SettingError:
    """The error of an optimizer that refused one of its ``arguments``, naming its key."""
    text = str(error)
    words = {"lr": "learning rate", "betas": "beta", "eps": "epsilon"}
    name = next(
        (n for n, v in arguments.items() if words.get(n, n) in text.lower() or (v is not None and str(v) in text)),
        None,
    )
    if name is None:
        return SettingError(f"{key}: {cls} refuses its settings ({text}); fix them and run again", key, None)
    fix = "give a learning rate > 0 (e.g. 1e-5)" if name == "lr" else "give a value it accepts"
    full, value = f"{key}.{name}", arguments[name]
    return SettingError(f"{full}={value!r}: {cls} refuses it ({text}); {fix}", full, value)


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


def imported(path: str) -> Any:
    """The object at the import ``path`` (``package.module.Name``), or ``None`` when it cannot be imported."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
