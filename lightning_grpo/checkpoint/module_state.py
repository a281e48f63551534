"""What a ``GRPOModule`` checkpoint holds beside Lightning's own state, and what resuming from one restores.

:func:`save_module_state` (``on_save_checkpoint``) keeps only the adapter's weights, records what the run was trained
on (:mod:`~lightning_grpo.checkpoint.records`) and stores the entropy control's state (docs/math.md);
:func:`resume_module_state` (``on_load_checkpoint``) refuses another policy's checkpoint, applies changed settings
(:mod:`~lightning_grpo.checkpoint.resume`) and restores the entropy control.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch import LightningModule

from lightning_grpo.algorithms.entropy import controller_state, restore_controller
from lightning_grpo.checkpoint.records import keep_adapter_only
from lightning_grpo.checkpoint.resume import check_resume
from lightning_grpo.config import GRPOConfig

__all__ = ["ENTROPY_CONTROL_KEY", "resume_module_state", "save_module_state"]

#: The checkpoint's key for the entropy control's state (the coefficient in use and the control's own state).
ENTROPY_CONTROL_KEY = "entropy_control"


def save_module_state(
    checkpoint: dict[str, Any],
    module: LightningModule,
    record: dict[str, Any],
    entropy_control: Callable[[float | None], float],
    entropy_coef: float,
) -> None:
    """Keep only ``module``'s trainable (adapter) weights in ``checkpoint``; store ``record`` and the entropy control.

    Args:
        checkpoint: The checkpoint Lightning is about to write.
        module: The module saved.
        record: What the run was trained on: ``{"policy": describe_policy(...), "optimizer": settings_of(...)}``.
        entropy_control: The module's entropy control.
        entropy_coef: The entropy coefficient in use.

    Raises:
        NonFiniteError: An adapter weight holds a NaN or an infinity: the checkpoint is not written.
    """
    keep_adapter_only(checkpoint, module, record)
    checkpoint[ENTROPY_CONTROL_KEY] = controller_state(entropy_control, entropy_coef)


def resume_module_state(
    checkpoint: dict[str, Any],
    module: LightningModule,
    trained_on: dict[str, Any],
    build_optimizer: Callable[[], tuple[torch.optim.Optimizer, Any | None]],
    entropy_control: Callable[[float | None], float],
    entropy_coef: float,
) -> float:
    """Refuse a checkpoint of another policy, apply changed settings, restore the entropy control.

    Args:
        checkpoint: The loaded checkpoint, before Lightning restores the optimizers and callbacks from it.
        module: The module resuming.
        trained_on: What the module's policy is (:func:`~lightning_grpo.checkpoint.describe_policy`).
        build_optimizer: Builds the module's optimizer and scheduler, fresh.
        entropy_control: The module's entropy control (its state is restored in place).
        entropy_coef: The entropy coefficient in use.

    Returns:
        The entropy coefficient to train on: the checkpoint's, or ``entropy_coef`` when it holds none.

    Raises:
        CheckpointMismatchError: The checkpoint was trained on another base model, LoRA shape or tokenizer.
    """
    defaults = {"grpo": asdict(GRPOConfig())}  # settings an older checkpoint lacks compare as their defaults
    check_resume(module, checkpoint, trained_on, build_optimizer, defaults)
    coef = restore_controller(entropy_control, checkpoint.get(ENTROPY_CONTROL_KEY))
    return entropy_coef if coef is None else coef
