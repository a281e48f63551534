"""PredictionWriter: each batch's rows as JSONL lines, in the run's folder unless told where, rewritten by each predict,
and its path said once at the end."""

from __future__ import annotations

import json

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lightning_grpo.callbacks import PredictionWriter
from tests.callbacks.test_quiet_lightning import lightning_lines


class Rows(LightningModule):
    """Predicts a row per item: its value and the value squared."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def predict_step(self, batch, batch_idx):
        return [{"x": int(x), "square": int(x) ** 2, "text": "é"} for x in batch]


def predict(writer: PredictionWriter, **trainer_args) -> list:
    trainer = Trainer(
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[writer],
        **{"logger": False, **trainer_args},
    )
    return trainer.predict(Rows(), DataLoader(list(range(5)), batch_size=2))


def test_rows_are_written_as_jsonl_and_the_path_said_once(tmp_path):
    writer = PredictionWriter(tmp_path / "out" / "rows.jsonl")
    with lightning_lines() as lines:
        batches = predict(writer)
    written = (tmp_path / "out" / "rows.jsonl").read_text(encoding="utf-8")
    assert [json.loads(line) for line in written.splitlines()] == [row for batch in batches for row in batch]
    assert '"text": "é"' in written  # readable, not escaped
    assert [line for line in lines if "rows.jsonl" in line] == [
        f"predictions: {tmp_path / 'out' / 'rows.jsonl'} (5 records)"
    ]
    predict(writer)  # a second predict writes the file anew
    assert len((tmp_path / "out" / "rows.jsonl").read_text().splitlines()) == 5


def test_without_a_path_the_file_goes_to_the_run_folder(tmp_path):
    writer = PredictionWriter()
    predict(writer, logger=CSVLogger(tmp_path, name="runs"), default_root_dir=tmp_path / "root")
    assert writer.written == tmp_path / "runs" / "version_0" / "predictions.jsonl"
    assert len(writer.written.read_text().splitlines()) == 5
