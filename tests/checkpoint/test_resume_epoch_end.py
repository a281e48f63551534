"""A run resumed from a checkpoint ``ModelCheckpoint`` saved at an epoch's end writes, after the rows written before
it, what an uninterrupted run writes: each step once, in order, in the same epoch, with the same rewards (the next
epochs shuffle their prompts as the uninterrupted run's do)."""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.callbacks import SaveOnInterrupt
from lightning_grpo.checkpoint.loop_state import align_logger_step, resume_after_epoch_end
from lightning_grpo.testing import TinyTaskDataModule, build_tiny_model, build_tiny_tokenizer
from tests.conftest import make_trainer, tiny_sampling

ITERATIONS = 7  # three per epoch (12 prompts, 4 a batch): epochs 0, 1 and the first iteration of 2
VOLATILE = ("time", "per_sec", "memory", "total_")  # clocks, and the throughput totals counted since the run started


def first_character(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A reward that differs within groups, so that every iteration updates the adapter."""
    return [ord(c[0]) % 7 / 7 if c else 0.0 for c in completions]


def _fit(root: Path, version: int, max_steps: int, *callbacks, ckpt_path: Path | None = None) -> None:
    """A tiny run to ``max_steps`` (from ``ckpt_path``), a checkpoint at each epoch's end in ``root/ckpt<version>``."""
    tokenizer = build_tiny_tokenizer()
    module = GRPOModule(
        build_tiny_model(tokenizer),
        [first_character],
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling=tiny_sampling()),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )
    saver = ModelCheckpoint(dirpath=root / f"ckpt{version}", every_n_epochs=1, save_top_k=-1)
    trainer = make_trainer(
        max_steps=max_steps,
        default_root_dir=root,
        logger=CSVLogger(root, name="run", version=version),
        log_every_n_steps=1,
        enable_checkpointing=True,
        callbacks=[saver, *callbacks],
    )
    data = TinyTaskDataModule("addition", task_args={"num_samples": 12}, batch_size=4)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)


def _rows(root: Path, version: int) -> list[dict[str, str]]:
    with open(root / "run" / f"version_{version}" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [{k: v for k, v in row.items() if not any(word in k for word in VOLATILE)} for row in rows]


def _labels(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(row["step"], row["epoch"]) for row in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    root = tmp_path_factory.mktemp("straight")
    _fit(root, 0, ITERATIONS)
    return _rows(root, 0)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 iterations: ``epoch=0-step=3.ckpt`` at epoch 0's end, ``epoch=1-step=4.ckpt`` when it stopped."""
    root = tmp_path_factory.mktemp("stopped")
    _fit(root, 0, 4, SaveOnInterrupt(export_adapter=False))
    return root


def test_the_straight_run_crosses_two_epoch_ends(straight):
    assert _labels(straight) == [("0", "0"), ("1", "0"), ("2", "0"), ("3", "1"), ("4", "1"), ("5", "1"), ("6", "2")]


def test_resumed_from_an_epoch_end_checkpoint_each_step_is_logged_once_with_the_straight_runs_values(
    tmp_path, straight, stopped
):
    # Lightning alone resumes this checkpoint at steps 4-7 (it counts a step without a batch) and shuffles epoch 1
    # as epoch 2, so its rewards differ from step 3 on
    _fit(
        tmp_path,
        1,
        ITERATIONS,
        SaveOnInterrupt(export_adapter=False),
        ckpt_path=stopped / "ckpt0" / "epoch=0-step=3.ckpt",
    )
    resumed = _rows(stopped, 0)[:3] + _rows(tmp_path, 1)
    assert _labels(resumed) == _labels(straight)
    assert resumed == straight


def test_resumed_from_the_checkpoint_of_a_run_stopped_inside_an_epoch_the_next_epoch_is_the_straight_runs(
    tmp_path, straight, stopped
):
    # ModelCheckpoint saves at the end of a run stopped by max_steps too (in on_train_epoch_end): epoch 1 goes on,
    # and epoch 2 (step 6) has the straight run's prompts, not epoch 3's
    _fit(
        tmp_path,
        1,
        ITERATIONS,
        SaveOnInterrupt(export_adapter=False),
        ckpt_path=stopped / "ckpt0" / "epoch=1-step=4.ckpt",
    )
    assert _rows(stopped, 0) + _rows(tmp_path, 1) == straight


def test_an_epoch_end_checkpoint_saved_before_this_fix_is_resumed_the_same(tmp_path, straight, monkeypatch):
    with monkeypatch.context() as patch:  # saved as Lightning alone saves it (and this package did before)
        patch.setattr(SaveOnInterrupt, "on_save_checkpoint", lambda *args: None)
        _fit(tmp_path, 0, 3)
    checkpoint = tmp_path / "ckpt0" / "epoch=0-step=3.ckpt"
    assert torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"] == 0
    _fit(tmp_path, 1, 5, ckpt_path=checkpoint)  # GRPOModule adds a SaveOnInterrupt: it is stored so on loading
    assert _rows(tmp_path, 0) + _rows(tmp_path, 1) == straight[:5]


def _epoch_end(batches: int, last: bool) -> dict:
    """The loops of a checkpoint saved in ``on_train_epoch_end`` of epoch 0 after ``batches`` iterations."""
    done = {"ready": batches, "started": batches, "processed": batches, "completed": batches}
    epoch = {"ready": 1, "started": 1, "processed": 1, "completed": 0}
    fit_loop = {
        "epoch_progress": {"total": epoch, "current": dict(epoch)},
        "epoch_loop.batch_progress": {"total": done, "current": dict(done), "is_last_batch": last},
        "epoch_loop.state_dict": {"_batches_that_stepped": batches},
    }
    return {"loops": {"fit_loop": fit_loop}}


def test_an_epoch_used_up_by_its_batch_limit_is_stored_finished_and_one_stopped_inside_it_goes_on():
    limited, cut = _epoch_end(3, last=False), _epoch_end(3, last=False)
    assert align_logger_step(limited, num_batches=3) and align_logger_step(cut, num_batches=5)
    for checkpoint, epoch in ((limited, [1, 1, 1, 1]), (cut, [1, 1, 0, 0])):
        loop = checkpoint["loops"]["fit_loop"]
        counts = loop["epoch_progress"]["total"]
        assert [counts[k] for k in ("ready", "started", "processed", "completed")] == epoch
        assert loop["epoch_loop.batch_progress"]["total"]["ready"] == 4  # the next batch fetched, not processed
        assert loop["epoch_loop.state_dict"]["_batches_that_stepped"] == 2
    assert limited["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"] == 0  # a new epoch
    assert cut["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"] == 3  # the same epoch


def test_other_checkpoints_are_left_as_they_are():
    # saved on validation end inside the last iteration (the epoch not yet processed), or inside an iteration's
    # on_train_batch_end (its batch not yet completed): Lightning resumes both at the right step
    on_validation_end = _epoch_end(3, last=True)
    on_validation_end["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"] = 0
    on_validation_end["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] = 0
    on_batch_end = _epoch_end(3, last=False)
    on_batch_end["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"] = 2
    for checkpoint in (on_validation_end, on_batch_end, {"loops": {}}, {}):
        before = copy.deepcopy(checkpoint)
        assert not resume_after_epoch_end(checkpoint, num_batches=3)
        assert checkpoint == before
