"""Reading the :class:`~lightning_grpo.iteration.StepOutput` that ``GRPOModule.training_step`` hands the callbacks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback

__all__ = ["step_output"]


def step_output(outputs: Any, callback: Callback, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """``outputs`` of ``on_train_batch_end`` as the step output, with a clear error when keys are missing.

    Raises:
        TypeError: If ``outputs`` is not a mapping holding ``keys`` (a ``training_step`` that is not
            ``GRPOModule``'s, or that does not return its ``StepOutput``).
    """
    missing = [key for key in keys if key not in outputs] if isinstance(outputs, Mapping) else list(keys)
    if missing:
        found = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise TypeError(
            f"{type(callback).__name__} reads the StepOutput that GRPOModule.training_step returns; the outputs lack "
            f"{missing} (got {found})"
        )
    return outputs
