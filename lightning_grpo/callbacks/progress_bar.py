"""A progress bar that shows the GRPO metrics under short names and fits in 80 columns."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBarTheme
from typing_extensions import override

from lightning_grpo.callbacks._phase_ticker import PhaseTicker

__all__ = ["SHORT_NAMES", "WHILE_NONZERO", "GRPOProgressBar", "readable_progress_bar"]

#: Shown in the bar by default: short name -> the full name the loggers receive.
SHORT_NAMES: Mapping[str, str] = MappingProxyType({"reward": "train/reward_mean", "kl": "train/kl"})

#: Shown only while non-zero: warnings that need the user's eye (docs/rewards.md, "no silent zero-signal runs").
WHILE_NONZERO: Mapping[str, str] = MappingProxyType({"zero_std": "train/zero_std_frac"})


class GRPOProgressBar(TQDMProgressBar):
    r"""Lightning's ``TQDMProgressBar`` showing chosen metrics under short names, e.g. ``reward=0.625, kl=0.00132``.

    Metrics are logged under their full names (``train/reward_mean``), which every logger receives, and without
    ``prog_bar=True``; this bar reads them from ``trainer.callback_metrics`` and shows each under its short name, so
    a line such as ``Epoch 3:  50%|█████     | 4/8 [00:09<00:09, 0.43it/s, reward=0.625, kl=0.00132]`` fits in
    80 columns. A metric not logged yet is left out. The bar shows exactly ``metrics``: what is logged with
    ``prog_bar=True`` under a long name, and the logger's version (``v_num``), is not shown; map a short name to a
    metric to show it. :data:`WHILE_NONZERO` metrics (``zero_std``: the fraction of groups without reward signal)
    appear only while they are non-zero. The bar of a ``max_steps`` run reads ``Epoch N`` (the epoch over the prompt
    data), never ``Epoch N/-2``. Add it as the last of ``trainer.callbacks`` (it shows what the callbacks before it
    logged in the same step) to replace Lightning's default bar (docs/callbacks.md).

    An iteration that runs longer than ``phase_interval`` seconds shows its phase and how long it has run, e.g.
    ``..., reward=0.625, phase=generate 12s]``, refreshed every ``phase_interval`` seconds by a thread of the process
    of global rank zero (the phase is read from ``GRPOModule.timer``, made a
    :class:`~lightning_grpo.iteration.phase.PhaseClock`: no host sync, no collective), so a slow iteration never
    leaves the bar frozen; the iteration's end puts the metrics back.

    Args:
        metrics: Short name to full name of the metrics to show; default :data:`SHORT_NAMES` (``reward`` for
            ``train/reward_mean``, logged by :class:`~lightning_grpo.callbacks.GroupRewardStats`, and ``kl`` for
            ``train/kl``, logged by ``GRPOModule`` when ``kl_coef > 0``).
        refresh_rate: Update the bar every this many batches (Lightning's argument).
        phase_interval: Seconds between two refreshes of the phase while an iteration runs (at most 10, so the bar
            moves at least every 10 s); ``None`` shows no phase.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import GRPOProgressBar
        >>> bar = GRPOProgressBar(metrics={"reward": "train/reward_mean", "len": "train/completion/length_mean"})
        >>> trainer = Trainer(callbacks=[bar], logger=False)
    """

    def __init__(
        self, metrics: Mapping[str, str] = SHORT_NAMES, refresh_rate: int = 1, phase_interval: float | None = 5.0
    ) -> None:
        bad = [f"{k!r}: {v!r}" for k, v in dict(metrics).items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise TypeError(f"metrics maps short names to metric names, both strings; got {', '.join(bad)}")
        super().__init__(refresh_rate=refresh_rate)
        self.metrics = dict(metrics)
        self.phase_interval = _checked_interval(phase_interval)
        self._ticker = None if phase_interval is None else PhaseTicker(phase_interval, self._show_phase)
        self._postfix: str | None = None  # the bar's postfix (the metrics) before the phase was added to it

    @override
    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, int | str | float | dict]:
        logged = trainer.callback_metrics
        shown = {short: logged[name].item() for short, name in self.metrics.items() if name in logged}
        warnings = {short: logged[name].item() for short, name in WHILE_NONZERO.items() if name in logged}
        return {**shown, **{short: value for short, value in warnings.items() if value != 0}}

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self._ticker is not None and trainer.is_global_zero and self.is_enabled:
            self._ticker.start(pl_module)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._ticker is not None:
            self._ticker.iteration_started()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._ticker is not None:
            self._ticker.iteration_ended()  # from here on the thread leaves the bar alone until the next iteration
        if self._postfix is not None:  # the metrics without the phase, also when this batch does not update the bar
            self._train_progress_bar.postfix, self._postfix = self._postfix, None
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_ticker()
        super().on_train_end(trainer, pl_module)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_ticker()
        super().teardown(trainer, pl_module, stage)

    def _show_phase(self, phase: str | None, seconds: float) -> None:
        """Show ``phase`` (``"generate 12s"``) after the metrics and redraw the bar (on the ticker's thread)."""
        bar = self._train_progress_bar
        if bar is None or bar.disable:
            return
        if self._postfix is None:
            self._postfix = bar.postfix or ""
        shown = f"phase={phase or f'iteration {seconds:.0f}s'}"
        bar.set_postfix_str(f"{self._postfix}, {shown}" if self._postfix else shown, refresh=True)

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Close the open bars, so that the error's message starts a line of its own."""
        self._stop_ticker()
        for name in ("_train_progress_bar", "_val_progress_bar", "_test_progress_bar", "_predict_progress_bar"):
            bar = getattr(self, name, None)
            if bar is not None and not getattr(bar, "disable", False):
                bar.close()


def _checked_interval(seconds: float | None) -> float | None:
    """``seconds`` if it is ``None`` or a number in ``(0, 10]``, else an error naming the allowed values."""
    number = isinstance(seconds, int | float) and not isinstance(seconds, bool) and math.isfinite(seconds)
    if seconds is not None and not (number and 0 < seconds <= 10):
        raise ValueError(f"phase_interval must be a number of seconds in (0, 10] or None (no phase), got {seconds!r}")
    return seconds


def readable_progress_bar(trainer: Trainer) -> list[GRPOProgressBar]:
    """A :class:`GRPOProgressBar` in place of Lightning's default bar; none when the user chose a bar or none.

    Lightning adds a plain ``TQDMProgressBar()`` (or ``RichProgressBar()``) when the trainer was given no progress
    bar: that one is taken out of ``trainer.callbacks`` and the returned bar, added last by
    ``configure_callbacks``, shows the GRPO metrics instead. A bar the user configured (another class, or other
    settings) stays, and so does ``enable_progress_bar=False``.
    """
    bar = trainer.progress_bar_callback
    if bar is None or not _is_lightning_default(bar):
        return []
    trainer.callbacks = [callback for callback in trainer.callbacks if callback is not bar]
    return [GRPOProgressBar()]


def _is_lightning_default(bar: Callback) -> bool:
    """Whether ``bar`` is the bar Lightning creates by itself: exactly its class, with default settings."""
    if type(bar) is TQDMProgressBar:
        default = TQDMProgressBar()
        return bar.refresh_rate == default.refresh_rate and bar.process_position == default.process_position
    if type(bar) is RichProgressBar:
        return bar.refresh_rate == RichProgressBar().refresh_rate and bar.theme == RichProgressBarTheme()
    return False
