"""Checks of a parsed config before anything is built: a bad value fails in seconds, naming its key.

Torch refuses an optimizer's learning rate only when the model is built, and a PromptDataModule opens its files only
when the Trainer sets it up; :meth:`~lightning_grpo.cli.GRPOCLI.before_instantiate_classes` checks both here first.
"""

from __future__ import annotations

from typing import Any

import torch
from jsonargparse import Namespace

from lightning_grpo.agents.message_checks import string_prompts_refused
from lightning_grpo.cli.import_paths import imported
from lightning_grpo.data import PromptDataModule
from lightning_grpo.data.sources import check_source_path, load_records
from lightning_grpo.settings_checks import SettingError

__all__ = ["check_conversational_prompts", "check_optimizers", "check_prompt_files"]


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


def check_prompt_files(config: Namespace) -> None:
    """Check the prompt sources of ``config``'s data module when it is a PromptDataModule (or a subclass of it).

    Raises:
        MissingDataError: A ``train_data``, ``val_data``, ``test_data`` or ``predict_data`` file is missing or has
            another suffix (naming the setting).
        MissingExtraError: An ``"hf:..."`` source without ``datasets`` (the ``data`` extra).
    """
    data = config.get("data")
    if isinstance(data, Namespace) and _is_prompt_datamodule(data.get("class_path")):
        for argument in ("train_data", "val_data", "test_data", "predict_data"):
            if data.get(f"init_args.{argument}") is not None:
                check_source_path(data.get(f"init_args.{argument}"), argument)


def _is_prompt_datamodule(path: Any) -> bool:
    """Whether the import ``path`` names :class:`~lightning_grpo.data.PromptDataModule` or a subclass of it."""
    cls = imported(str(path))
    return isinstance(cls, type) and issubclass(cls, PromptDataModule)


def check_conversational_prompts(config: Namespace) -> None:
    """Refuse string prompts for a module with tools or an environment before the model loads (seconds, not minutes).

    Reads the first row of a local ``train_data`` file of a PromptDataModule without ``chat_template``; the data
    module checks every row again at setup (and covers sources read only then: lists, Hugging Face datasets).

    Raises:
        SettingError: Its prompt is a string, or ``prompt_template`` makes it one (the message names the fix).
    """
    data, module = config.get("data"), config.get("model")
    if not (isinstance(data, Namespace) and isinstance(module, Namespace)):
        return
    needs_messages = module.get("init_args.tools") or module.get("init_args.environment_factory")
    source = data.get("init_args.train_data")
    if not needs_messages or data.get("init_args.chat_template") or not _is_prompt_datamodule(data.get("class_path")):
        return
    if not isinstance(source, str) or source.startswith("hf:"):
        return
    template, field = data.get("init_args.prompt_template"), data.get("init_args.prompt_field") or "prompt"
    row = load_records(source, prompt_field=None if template else field, split=None)[0]
    prompt = template.format(**row) if template else row[field]
    if isinstance(prompt, str):
        raise string_prompts_refused(f"data.init_args.train_data={source!r} row 0", prompt)
