"""On Ctrl-C, save a resumable checkpoint of the last completed GRPO iteration and the adapter before exiting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

__all__ = ["SaveOnInterrupt"]


class SaveOnInterrupt(Callback):
    r"""When a run is stopped with Ctrl-C (SIGINT), save a checkpoint to resume from and export the adapter.

    Lightning turns Ctrl-C into a graceful shutdown and calls ``on_exception``; this callback then writes
    ``interrupted-step=<N>.ckpt`` (``N`` = ``trainer.global_step``, the optimizer steps completed) into the
    ``ModelCheckpoint``'s folder (or ``dirpath``), and the adapter in PEFT format beside the
    :class:`~lightning_grpo.callbacks.AdapterExport` exports (or beside the checkpoint). Stopped while sampling or
    scoring, the module still holds the last completed iteration, which is what is saved: resuming from the file
    repeats the interrupted iteration exactly. Stopped between two optimizer steps of one iteration (several
    mini-batches or ``ppo_epochs``), the adapter is half-updated: nothing is saved then, and a warning says so.
    Runs of several processes (DDP, FSDP2) are not saved either: each rank stops at its own point, possibly inside a
    collective, so they resume from their last periodic checkpoint.
    Resume with ``--ckpt_path <the file>`` (docs/distributed.md).

    Args:
        dirpath: Folder of the checkpoint; ``None`` uses the ``ModelCheckpoint``'s folder, or ``checkpoints`` in the
            run's log folder.
        export_adapter: Also export the adapter.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import SaveOnInterrupt
        >>> trainer = Trainer(callbacks=[SaveOnInterrupt()], logger=False)
    """

    def __init__(self, dirpath: str | Path | None = None, export_adapter: bool = True) -> None:
        self.dirpath = dirpath
        self.export_adapter = export_adapter
        self._step_at_batch_start: int | None = None  # set while an iteration runs

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_at_batch_start = None

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt) or not trainer.training:
            return
        if trainer.world_size > 1:  # ranks stop at different points, possibly inside a collective: no safe save
            rank_zero_warn(
                "Interrupted: SaveOnInterrupt saves single-process runs only; resume from the last checkpoint."
            )
            return
        started = self._step_at_batch_start
        if started is not None and trainer.global_step != started:
            rank_zero_warn(
                f"Interrupted between two optimizer steps of one GRPO iteration (steps {started} to "
                f"{trainer.global_step}): the adapter is partly updated, so no checkpoint was saved on interrupt; "
                "resume from the last periodic checkpoint."
            )
            return
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        message = f"Interrupted: saved {path}; resume with --ckpt_path {path}"
        if self.export_adapter and callable(getattr(pl_module, "export_adapter", None)):
            adapter = self._adapter_path(trainer)
            if getattr(pl_module, "export_adapter_all_ranks", False) or trainer.is_global_zero:
                pl_module.export_adapter(adapter)
            message += f"; the adapter is in {adapter}"
        rank_zero_info(message)

    def checkpoint_path(self, trainer: Trainer) -> Path:
        """``<folder>/interrupted-step=<global_step>.ckpt``."""
        folder = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None)
        if folder is None:
            run = trainer.log_dir if trainer.loggers else trainer.default_root_dir
            folder = Path(run or trainer.default_root_dir) / "checkpoints"
        return Path(folder) / f"interrupted-step={trainer.global_step}.ckpt"

    def _adapter_path(self, trainer: Trainer) -> Path:
        name = f"interrupted-step-{trainer.global_step}"
        for callback in trainer.callbacks:
            if callable(getattr(callback, "path_for", None)):  # AdapterExport: beside its exports
                return callback.path_for(trainer, name)
        return self.checkpoint_path(trainer).with_name(name)
