"""Predictions to a JSONL file, one line per prompt, and where the file is, said once when predict ends."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

__all__ = ["PredictionWriter"]


class PredictionWriter(BasePredictionWriter):
    """Write what ``predict_step`` returns, a list of records per batch, to a JSONL file as each batch ends.

    With ``GRPOModule`` a record is one prompt: ``{"dataset_index": 3, "prompt": "3+4=", "completions": ["7", ...],
    "rewards": [1.0, ...]}`` (``rewards`` when the reward functions can score the data; docs/evaluation.md). The
    file is rewritten by each ``trainer.predict``; its path is said once when predict ends. Under several processes
    each rank writes its own file, ``<stem>.rank<k>.jsonl`` (Lightning's distributed sampler may repeat a few
    prompts so that every rank has as many batches).

    ``GRPOModule`` adds one by itself when predicting (its ``configure_callbacks``) unless the trainer has a
    ``BasePredictionWriter``: pass ``PredictionWriter(path=...)`` to choose the file.

    Args:
        path: The JSONL file; ``None``: ``predictions.jsonl`` in the run's folder (the logger's ``log_dir``, else
            ``trainer.default_root_dir``).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[PredictionWriter("predictions.jsonl")], logger=False)
    """

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__(write_interval="batch")
        self.path = None if path is None else Path(path)
        self.written: Path | None = None  # this rank's file, once predict started
        self.records = 0  # records this rank wrote

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        path = self.path or Path(trainer.log_dir or trainer.default_root_dir) / "predictions.jsonl"  # every rank
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")
        self.written, self.records = path, 0

    @override
    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        if self.written is None:
            raise RuntimeError("PredictionWriter writes during trainer.predict only")
        records = prediction if isinstance(prediction, list) else [prediction]
        with self.written.open("a", encoding="utf-8") as file:
            file.writelines(json.dumps(record, ensure_ascii=False, default=str) + "\n" for record in records)
        self.records += len(records)

    @override
    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.written is None:
            return
        if trainer.world_size > 1:
            pattern = self.written.with_name(self.written.name.replace(f".rank{trainer.global_rank}.", ".rank*."))
            rank_zero_info(f"predictions: {pattern} (one file per rank)")
        else:
            rank_zero_info(f"predictions: {self.written} ({self.records} records)")
