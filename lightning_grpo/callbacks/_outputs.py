"""Shared by the callbacks: reading the :class:`~lightning_grpo.iteration.StepOutput`, checking arguments, and choosing
the default callbacks a trainer lacks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

__all__ = ["IterationCounter", "check_positive_int", "check_prefix", "missing_callbacks", "step_output"]


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


def check_prefix(prefix: Any) -> str:
    """``prefix`` if it is a string, else a ``TypeError``."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string such as 'train/', got {prefix!r} ({type(prefix).__name__})")
    return prefix


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """``value`` if it is an int >= 1 (or ``None`` when allowed), else a ``ValueError`` naming the allowed values."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = "an int >= 1" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


class IterationCounter(Callback):
    """Base of callbacks that act every n GRPO iterations; the count survives checkpoints.

    ``trainer.global_step`` counts optimizer steps, several per iteration, so the callback counts iterations itself.
    """

    def __init__(self) -> None:
        self.iterations = 0

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations = state_dict["iterations"]


def missing_callbacks(defaults: Iterable[Callback], present: Iterable[Callback]) -> list[Callback]:
    """The ``defaults`` whose type is not related to the type of any ``present`` callback, in order.

    A default is left out when a present callback is of its type, of a subclass or of a base class (other than
    ``Callback``): Lightning replaces a trainer's callback by a module's one of a subclass, so the user's would lose.

    Example::

        >>> from lightning.pytorch.callbacks import ThroughputMonitor, Timer
        >>> from lightning_grpo.callbacks import GroupRewardStats, ThroughputMonitor as GRPOThroughput
        >>> defaults = [GroupRewardStats(), GRPOThroughput()]
        >>> [type(c).__name__ for c in missing_callbacks(defaults, [Timer(), ThroughputMonitor(len)])]
        ['GroupRewardStats']
    """
    kinds = {type(callback) for callback in present} - {Callback}
    related = lambda cls: any(issubclass(cls, kind) or issubclass(kind, cls) for kind in kinds)  # noqa: E731
    return [callback for callback in defaults if not related(type(callback))]
