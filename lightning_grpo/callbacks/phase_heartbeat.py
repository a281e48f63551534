"""``PhaseHeartbeat``: without a progress bar, a log line every ``interval`` seconds of a long GRPO iteration."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_grpo.callbacks._phase_ticker import PhaseTicker
from lightning_grpo.settings_checks import check_number

__all__ = ["PhaseHeartbeat"]


class PhaseHeartbeat(Callback):
    r"""Logs which phase of a GRPO iteration runs, and for how long, while an iteration runs long; silent otherwise.

    A fit without a progress bar (``enable_progress_bar=False``, a log file) would say nothing while one iteration
    samples for minutes. This callback logs (``rank_zero_info``, on the process of global rank zero) one line every
    ``interval`` seconds once an iteration has run that long, such as
    ``GRPO iteration (optimizer step 12): generate 40s (the iteration 52s)``. The phase (``sync``, ``generate``,
    ``score``, ``old_logprobs``, ``reference``, ``update``) is read on a thread from ``GRPOModule.timer``, made a
    :class:`~lightning_grpo.iteration.phase.PhaseClock`: no host sync, no collective. With a progress bar it says
    nothing: :class:`~lightning_grpo.callbacks.GRPOProgressBar` shows the phase itself (docs/callbacks.md).

    Args:
        interval: Seconds between two lines, and before the first one of an iteration.

    Raises:
        ValueError: ``interval`` is not a number > 0.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks.phase_heartbeat import PhaseHeartbeat
        >>> trainer = Trainer(callbacks=[PhaseHeartbeat(interval=10.0)], enable_progress_bar=False, logger=False)
    """

    def __init__(self, interval: float = 10.0) -> None:
        check_number("interval", interval, minimum=0.0, exclusive_minimum=True)
        self.interval = float(interval)
        self._ticker = PhaseTicker(self.interval, self._log_phase)
        self._step = 0  # the optimizer step the running iteration started at

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and trainer.progress_bar_callback is None:
            self._ticker.start(pl_module)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step = trainer.global_step
        self._ticker.iteration_started()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._ticker.iteration_ended()

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ticker.stop()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._ticker.stop()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._ticker.stop()

    def _log_phase(self, phase: str | None, seconds: float) -> None:
        """One line: the phase running now (``"generate 40s"``) and how long the iteration has run."""
        running = f"{phase} (the iteration {seconds:.0f}s)" if phase else f"running for {seconds:.0f}s"
        rank_zero_info(f"GRPO iteration (optimizer step {self._step}): {running}")
