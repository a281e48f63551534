"""A progress bar that shows the GRPO metrics under short names and fits in 80 columns."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBarTheme
from typing_extensions import override

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

    Args:
        metrics: Short name to full name of the metrics to show; default :data:`SHORT_NAMES` (``reward`` for
            ``train/reward_mean``, logged by :class:`~lightning_grpo.callbacks.GroupRewardStats`, and ``kl`` for
            ``train/kl``, logged by ``GRPOModule`` when ``kl_coef > 0``).
        refresh_rate: Update the bar every this many batches (Lightning's argument).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import GRPOProgressBar
        >>> bar = GRPOProgressBar(metrics={"reward": "train/reward_mean", "len": "train/completion/length_mean"})
        >>> trainer = Trainer(callbacks=[bar], logger=False)
    """

    def __init__(self, metrics: Mapping[str, str] = SHORT_NAMES, refresh_rate: int = 1) -> None:
        bad = [f"{k!r}: {v!r}" for k, v in dict(metrics).items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise TypeError(f"metrics maps short names to metric names, both strings; got {', '.join(bad)}")
        super().__init__(refresh_rate=refresh_rate)
        self.metrics = dict(metrics)

    @override
    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, int | str | float | dict]:
        logged = trainer.callback_metrics
        shown = {short: logged[name].item() for short, name in self.metrics.items() if name in logged}
        warnings = {short: logged[name].item() for short, name in WHILE_NONZERO.items() if name in logged}
        return {**shown, **{short: value for short, value in warnings.items() if value != 0}}

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Close the open bars, so that the error's message starts a line of its own."""
        for name in ("_train_progress_bar", "_val_progress_bar", "_test_progress_bar", "_predict_progress_bar"):
            bar = getattr(self, name, None)
            if bar is not None and not getattr(bar, "disable", False):
                bar.close()


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
