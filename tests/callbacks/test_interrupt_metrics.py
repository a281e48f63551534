"""A run stopped by Ctrl-C or SIGTERM at any point of an iteration and resumed from the checkpoint it saved logs, with
the rows written before the stop, what an uninterrupted run logs: each step once, in order, the same values."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.callbacks import SaveOnInterrupt
from lightning_grpo.testing import TinyTaskDataModule, build_tiny_model, build_tiny_tokenizer
from tests.cli.signal_at import SignalAt
from tests.conftest import make_trainer, tiny_sampling

ITERATIONS = 5  # three per epoch (12 prompts, 4 a batch): the runs below cross an epoch's end
STOPPED_IN = 2  # the last iteration of epoch 0
VOLATILE = ("time", "per_sec", "memory", "total_")  # clocks, and the throughput totals counted since the run started


def first_character(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A reward that differs within groups, so that every iteration updates the adapter."""
    return [ord(c[0]) % 7 / 7 if c else 0.0 for c in completions]


def _module() -> GRPOModule:
    tokenizer = build_tiny_tokenizer()
    return GRPOModule(
        build_tiny_model(tokenizer),
        [first_character],
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling=tiny_sampling()),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )


def _fit(root: Path, version: int, *callbacks, ckpt_path: Path | None = None) -> None:
    """``ITERATIONS`` iterations of a tiny run (or the rest of them from ``ckpt_path``), metrics in ``version_<n>``."""
    logger = CSVLogger(root, name="run", version=version)
    trainer = make_trainer(
        max_steps=ITERATIONS, default_root_dir=root, logger=logger, log_every_n_steps=1, callbacks=list(callbacks)
    )
    data = TinyTaskDataModule("addition", task_args={"num_samples": 12}, batch_size=4)
    trainer.fit(_module(), datamodule=data, ckpt_path=ckpt_path)


def _rows(root: Path, version: int) -> list[dict[str, str]]:
    with open(root / "run" / f"version_{version}" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [{k: v for k, v in row.items() if not any(word in k for word in VOLATILE)} for row in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    root = tmp_path_factory.mktemp("straight")
    _fit(root, 0)
    return _rows(root, 0)


@pytest.mark.parametrize("phase", ["start", "backward", "update", "end"])
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_run_stopped_anywhere_in_an_iteration_resumes_its_metrics_each_step_once(tmp_path, straight, name, phase):
    # Ctrl-C before the update (start: before sampling; backward: sampled and scored) saves iterations 0-1 and the
    # resumed run repeats iteration 2; once the update has begun (update, end) iteration 2 finishes and writes its
    # row first. SIGTERM is acted on when the next iteration starts: iteration 2's row is written, epoch 0 ends.
    immediate = name == "SIGINT" and phase in ("start", "backward")
    stop = pytest.raises(SystemExit) if name == "SIGINT" else pytest.raises(SIGTERMException)
    with stop:
        _fit(tmp_path, 0, SaveOnInterrupt(export_adapter=False), SignalAt(STOPPED_IN, phase, name))
    saved = STOPPED_IN if immediate else STOPPED_IN + 1
    (checkpoint,) = (tmp_path / "run" / "version_0" / "checkpoints").glob("interrupted-*.ckpt")
    assert checkpoint.name == f"interrupted-step={saved}.ckpt"
    assert [row["step"] for row in _rows(tmp_path, 0)] == [str(step) for step in range(saved)]

    _fit(tmp_path, 1, ckpt_path=checkpoint)
    assert _rows(tmp_path, 0) + _rows(tmp_path, 1) == straight
