"""A callback for CLI tests: appends each training batch's ``dataset_index`` column, one JSON line per iteration.

``--trainer.callbacks+=tests.cli.prompt_recorder.PromptRecorder --trainer.callbacks.path=<file>``
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class PromptRecorder(Callback):
    """Writes ``{"step": global_step_at_start, "rows": [dataset_index, ...]}`` for every training batch.

    Args:
        path: The JSON-lines file appended to.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": trainer.global_step, "rows": list(batch["dataset_index"])}) + "\n")


def read_batches(path: Path) -> dict[int, list[int]]:
    """The recorded batches by the step they started at."""
    lines = path.read_text().splitlines() if path.exists() else []
    return {entry["step"]: entry["rows"] for entry in map(json.loads, lines)}
