"""Resuming with changed settings: a new learning rate or schedule takes effect, and the change is reported.

Lightning restores the optimizer's and scheduler's state dicts from the checkpoint, hyperparameters included, so a
learning rate or schedule changed for the resumed run would be silently replaced by the checkpoint's. Here the
settings a run *started* with are saved in its checkpoints; when the resuming run starts with other ones, the
checkpoint's optimizer hyperparameters and scheduler state are replaced by those of the new settings at the resumed
step (the optimizer's moments are kept). Algorithm settings (``kl_coef``, ``max_new_tokens``, ...) are read from the
module's config at each step and take effect by themselves. docs/distributed.md shows a resume from the command line.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info

from lightning_grpo.checkpoint.old_settings import upgrade_grpo_settings
from lightning_grpo.checkpoint.records import CHECKPOINT_KEY, check_same_policy

__all__ = ["apply_new_settings", "check_resume", "report_changed_settings", "settings_of"]

_PROGRESS_KEYS = ("last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial")


def check_resume(
    module: LightningModule,
    checkpoint: dict[str, Any],
    trained_on: dict[str, Any],
    build: Callable[[], tuple[torch.optim.Optimizer, Any | None]],
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """``GRPOModule.on_load_checkpoint``: refuse another policy's checkpoint, then apply and report changed settings
    (an older checkpoint's ``grpo`` settings are first put in today's names: :mod:`.old_settings`).

    Args:
        module: The module resuming (attached to a trainer, or not for ``load_from_checkpoint``).
        checkpoint: The loaded checkpoint.
        trained_on: :func:`~lightning_grpo.checkpoint.records.describe_policy` of this module's policy.
        build: Builds this run's optimizer and scheduler, fresh.
        defaults: The default of each setting by section (``{"grpo": {...}}``): a setting an older checkpoint lacks
            (added since) counts as saved with its default, so only a value other than the default is reported.

    Raises:
        CheckpointMismatchError: The checkpoint was trained on another base model, LoRA shape or tokenizer.
    """
    record = checkpoint.get(CHECKPOINT_KEY, {})
    trainer = module._trainer
    check_same_policy(record.get("policy"), trained_on, trainer.ckpt_path if trainer is not None else None)
    saved = checkpoint.get("hyper_parameters")
    if isinstance(saved, dict) and isinstance(saved.get("grpo"), Mapping):  # older names in today's (old_settings.py)
        saved["grpo"] = upgrade_grpo_settings(saved["grpo"])
    report_changed_settings(saved, module.hparams, defaults)
    if trainer is not None:
        apply_new_settings(checkpoint, record.get("optimizer"), build)


def settings_of(optimizer: torch.optim.Optimizer, scheduler: Any | None) -> dict[str, Any]:
    """The hyperparameters an optimizer and scheduler start with, as plain values (no progress, no tensors)."""
    skip = ("params", "initial_lr")
    groups = [{k: _plain(v) for k, v in group.items() if k not in skip} for group in optimizer.param_groups]
    settings: dict[str, Any] = {"optimizer": type(optimizer).__name__, "param_groups": groups}
    if scheduler is not None:
        state = {k: _plain(v) for k, v in scheduler.state_dict().items() if k not in _PROGRESS_KEYS}
        settings["scheduler"] = {"type": type(scheduler).__name__, **state}
    return settings


def apply_new_settings(
    checkpoint: dict[str, Any],
    saved: Mapping[str, Any] | None,
    build: Callable[[], tuple[torch.optim.Optimizer, Any | None]],
) -> list[str]:
    """Put the new run's optimizer hyperparameters and scheduler (at the checkpoint's step) into ``checkpoint``.

    Args:
        checkpoint: The loaded checkpoint, before Lightning restores optimizers and schedulers from it.
        saved: :func:`settings_of` the run that wrote it (``None``: older checkpoint, left as it is).
        build: Builds this run's optimizer and scheduler, fresh (a throwaway pair over the same parameters).

    Returns:
        The names of the settings that changed (empty: the checkpoint is left untouched).
    """
    optimizer, scheduler = build()
    current = settings_of(optimizer, scheduler)
    changed = _differences(saved, current) if saved else []
    states = checkpoint.get("optimizer_states") or []
    if not changed or len(states) != 1 or len(states[0]["param_groups"]) != len(optimizer.param_groups):
        return []
    schedulers = checkpoint.get("lr_schedulers") or []
    if scheduler is not None and len(schedulers) == 1:
        steps = int(schedulers[0].get("last_epoch", 0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no update is wanted here
            for _ in range(steps):
                scheduler.step()
        schedulers[0] = scheduler.state_dict()
    for saved_group, new_group in zip(states[0]["param_groups"], optimizer.param_groups, strict=True):
        saved_group.update({k: v for k, v in new_group.items() if k != "params"})
    rank_zero_info(f"Resuming with changed optimizer settings, which take effect now: {', '.join(changed)}")
    return changed


def report_changed_settings(
    saved: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """Log the module settings (``grpo.*``, ``seed``) that differ from the checkpoint's; they take effect as given.

    A setting missing from a section of ``saved`` (a checkpoint older than the setting), at any depth, is compared as
    its value in ``defaults``.
    """
    if saved and defaults:
        filled = {
            key: _with_defaults(saved[key], defaults[key]) for key in defaults if isinstance(saved.get(key), Mapping)
        }
        saved = {**saved, **filled}
    changed = _differences(saved, current, keys=("grpo", "seed")) if saved else []
    if changed:
        rank_zero_info(f"Resuming with changed settings, which take effect now: {', '.join(changed)}")
    return changed


def _with_defaults(saved: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` with every setting it lacks taken from ``defaults``, at every depth (a setting added to a group)."""
    merged = dict(saved)
    for key, default in defaults.items():
        if key not in merged:
            merged[key] = default
        elif isinstance(default, Mapping) and isinstance(merged[key], Mapping):
            merged[key] = _with_defaults(merged[key], default)
    return merged


def _differences(saved: Any, current: Any, keys: tuple[str, ...] | None = None, prefix: str = "") -> list[str]:
    """``name: old -> new`` for each leaf that differs (only under ``keys`` at the top level, when given)."""
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        names = keys if keys is not None else sorted(set(saved) | set(current))
        return [
            line
            for name in names
            for line in _differences(saved.get(name), current.get(name), prefix=f"{prefix}{name}.")
        ]
    groups = isinstance(saved, list | tuple) and isinstance(current, list | tuple) and len(saved) == len(current)
    if groups and any(isinstance(item, Mapping) for item in saved):
        index = (lambda i: f"{i}.") if len(saved) > 1 else (lambda i: "")
        pairs = enumerate(zip(saved, current, strict=True))
        return [line for i, (a, b) in pairs for line in _differences(a, b, prefix=f"{prefix}{index(i)}")]
    if _plain(saved) == _plain(current):
        return []
    return [f"{prefix.rstrip('.')} {saved!r} -> {current!r}"]


def _plain(value: Any) -> Any:
    """Numbers, strings, bools, ``None`` and lists of them as they are; tensors as numbers; anything else as text."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return type(value).__name__
