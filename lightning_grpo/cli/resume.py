"""A resumed command-line run writes on in the run folder of its checkpoint: one curve, one ``metrics.csv``."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Callback, LightningModule, Trainer

__all__ = ["ReplayMetrics", "continue_in_checkpoint_folder", "earlier_rows"]

#: Loggers whose run folder is ``<save_dir>/<name>/version_<N>`` and that append to it when given its version.
_VERSIONED = ("lightning.pytorch.loggers.CSVLogger", "lightning.pytorch.loggers.TensorBoardLogger")


class ReplayMetrics(Callback):
    """Write the resumed run's earlier ``metrics.csv`` rows (before its first step now) into the logger again.

    Lightning's CSV writer empties a version folder's ``metrics.csv`` when it opens it; the rows read before are
    logged again at the start of training, as they were written (the ``epoch`` column a whole number), so the file
    holds the whole curve, each step once.

    Args:
        rows: The rows of the earlier ``metrics.csv`` (:func:`earlier_rows`).
    """

    def __init__(self, rows: list[dict[str, str]]) -> None:
        self.rows = rows

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the rows of the iterations the checkpoint holds, on rank zero.

        The ``step`` column is Lightning's logger step, one per iteration (``training_step``), not ``global_step``
        (optimizer steps, several per iteration with mini-batches): the resumed run writes from the number of
        iterations the checkpoint holds, and a row written after the checkpoint was saved is left to it.
        """
        if not trainer.is_global_zero or trainer.logger is None:
            return
        iterations = trainer.fit_loop.epoch_loop.batch_progress.total.processed  # restored from the checkpoint
        for row in self.rows:
            step = int(row.get("step") or 0)
            values: dict[str, Any] = {k: _number(v) for k, v in row.items() if k != "step" and v not in ("", None)}
            if step < iterations and values:
                trainer.logger.log_metrics(values, step=step)


def _number(text: str) -> int | float:
    """A ``metrics.csv`` value as Lightning logged it: ``"1"`` (the ``epoch`` column) an int, others floats."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def earlier_rows(version_folder: Path) -> list[dict[str, str]]:
    """The rows of ``version_folder/metrics.csv`` (none when it does not exist)."""
    path = version_folder / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def continue_in_checkpoint_folder(config: Namespace) -> Path | None:
    """Give the logger the version of the run folder holding ``config.ckpt_path``; that folder, or ``None``.

    Only when the checkpoint lies in ``<save_dir>/<name>/version_<N>/`` of this run's own CSV or TensorBoard logger
    and no version was chosen: the resumed run then appends to that folder's ``metrics.csv`` (and its
    ``ModelCheckpoint`` keeps its folder) instead of starting ``version_<N+1>`` beside it. A checkpoint from
    elsewhere, or an explicit version, changes nothing.
    """
    checkpoint, logger = config.get("ckpt_path"), config.get("trainer.logger")
    if not checkpoint or not isinstance(logger, Namespace) or logger.get("init_args.version") is not None:
        return None
    if str(logger.get("class_path")) not in _VERSIONED or not Path(str(checkpoint)).is_file():
        return None
    save_dir, name = logger.get("init_args.save_dir"), logger.get("init_args.name")
    runs = (Path(str(save_dir)) / (name or "")).resolve()
    for folder in Path(str(checkpoint)).resolve().parents:
        match = re.fullmatch(r"version_(\d+)", folder.name)
        if match and folder.parent == runs:
            logger.init_args.version = int(match.group(1))
            return folder
    return None
