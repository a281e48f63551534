"""A callback for CLI tests: the process sends itself a signal at a chosen phase of a chosen GRPO iteration.

``--trainer.callbacks+={"class_path": "tests.cli.signal_at.SignalAt", "init_args": {"iteration": 3, ...}}``: a real
signal (``signal.raise_signal``), as Ctrl-C or a scheduler's ``kill`` sends it, at a point known in advance, so that
a test of stopping and resuming is the same every time. Put it after ``SaveOnInterrupt`` in the callbacks (``+=``
does): its hooks then run after that callback's.
"""

from __future__ import annotations

import signal
from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer

__all__ = ["SignalAt"]

Phase = Literal["start", "backward", "update", "end"]


class SignalAt(Callback):
    """Sends ``signal`` once, in the iteration that starts at optimizer step ``iteration``, at ``phase``.

    Phases: ``start`` (``on_train_batch_start``, before sampling), ``backward`` (the first ``on_before_backward``:
    sampled and scored, no optimizer step yet), ``update`` (the first ``on_before_optimizer_step``: the update has
    begun) and ``end`` (``on_train_batch_end``, the update done, its metrics not yet written).

    Args:
        iteration: ``trainer.global_step`` at the start of the iteration to stop (the tiny config takes one optimizer
            step per iteration, so it is the iteration's index too).
        phase: Where in that iteration the signal is sent.
        signal: ``SIGINT`` (Ctrl-C) or ``SIGTERM``.
    """

    def __init__(self, iteration: int, phase: Phase, signal: Literal["SIGINT", "SIGTERM"]) -> None:
        self.iteration = iteration
        self.phase = phase
        self.signal = signal
        self._armed = False
        self._sent = False

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._armed = trainer.global_step == self.iteration and not self._sent
        self._send("start")

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        self._send("backward")

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._send("update")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._send("end")

    def _send(self, phase: Phase) -> None:
        if self._armed and phase == self.phase:
            self._armed, self._sent = False, True
            signal.raise_signal(getattr(signal, self.signal))
