"""``IterationCounter``: the base of callbacks that act every n GRPO iterations."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

__all__ = ["IterationCounter"]


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
