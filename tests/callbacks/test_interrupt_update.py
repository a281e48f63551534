"""Ctrl-C during an update finishes the iteration and saves it; every other stop names a checkpoint and the command."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo.callbacks import SaveOnInterrupt
from lightning_grpo.config import UpdateConfig
from tests.conftest import make_trainer, prompt_loader

PROMPTS = ["1+1=", "2+2="]


@contextlib.contextmanager
def lightning_info() -> Iterator[list[str]]:
    """The messages of ``rank_zero_info`` while the block runs (Lightning's logger does not propagate to pytest's)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def _ctrl_c_after_optimizer_step(n: int) -> type[torch.optim.AdamW]:
    """AdamW that sends itself SIGINT (a real Ctrl-C) right after its ``n``-th step has updated the adapter."""

    class CtrlCAfterStep(torch.optim.AdamW):
        steps = 0

        def step(self, closure=None):
            loss = super().step(closure)
            type(self).steps += 1
            if type(self).steps == n:
                signal.raise_signal(signal.SIGINT)
            return loss

    return CtrlCAfterStep


@pytest.mark.parametrize(("mini_batch_size", "ctrl_c_at", "saved_step"), [(None, 2, 2), (4, 3, 4)])
def test_ctrl_c_during_an_update_saves_the_iteration_once_it_ends(
    make_module, tmp_path, capfd, mini_batch_size, ctrl_c_at, saved_step
):
    # one optimizer step per iteration (Ctrl-C after iteration 2's update, before its end), or two (after the first
    # of iteration 2's two steps): either way iteration 2 completes and is saved, nothing more is lost
    module = make_module(update=UpdateConfig(mini_batch_size=mini_batch_size))
    optimizer = _ctrl_c_after_optimizer_step(ctrl_c_at)
    module.optimizer_factory = lambda params: optimizer(params, lr=1e-2)
    trainer = make_trainer(max_steps=20, default_root_dir=tmp_path, callbacks=[SaveOnInterrupt()])
    with lightning_info() as info, pytest.raises(SystemExit):
        trainer.fit(module, prompt_loader(PROMPTS, repeat=10))
    checkpoint = tmp_path / "checkpoints" / f"interrupted-step={saved_step}.ckpt"
    assert torch.load(checkpoint, weights_only=True)["global_step"] == saved_step
    assert "finishing this GRPO iteration's update" in capfd.readouterr().err
    assert f"Resume with: trainer.fit(module, data, ckpt_path='{checkpoint}')" in "\n".join(info)


def test_a_stop_inside_an_update_names_the_last_checkpoint_and_the_command(make_module, tmp_path):
    module = make_module(update=UpdateConfig(mini_batch_size=4))  # two optimizer steps per iteration

    class StopBetweenSteps(torch.optim.AdamW):
        calls = 0

        def zero_grad(self, set_to_none=True):
            type(self).calls += 1
            if type(self).calls == 3:  # iteration 2, after its first step: a second Ctrl-C, or a raw interrupt
                raise KeyboardInterrupt
            super().zero_grad(set_to_none)

    module.optimizer_factory = lambda params: StopBetweenSteps(params, lr=1e-2)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = make_trainer(max_steps=8, enable_checkpointing=True, callbacks=[saver, SaveOnInterrupt()])
    with pytest.warns(UserWarning) as warned, pytest.raises(SystemExit):
        trainer.fit(module, prompt_loader(PROMPTS, repeat=4))
    message = next(str(w.message) for w in warned if "partly updated" in str(w.message))
    last = tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    assert last.exists() and not list((tmp_path / "ckpt").glob("interrupted*"))
    assert f"The last checkpoint is {last}; resume with: trainer.fit(module, data, ckpt_path='{last}')" in message


def test_under_ddp_ctrl_c_names_the_last_checkpoint_and_the_command(tmp_path, monkeypatch):
    (tmp_path / "epoch=0-step=4.ckpt").write_bytes(b"")
    argv = ["/venv/bin/lightning-grpo", "fit", "--config", "run.yaml"]
    monkeypatch.setattr("sys.argv", argv)
    trainer = SimpleNamespace(world_size=2, training=True, checkpoint_callback=SimpleNamespace(dirpath=tmp_path),
                              global_step=7)  # fmt: skip
    with pytest.warns(UserWarning) as warned:
        SaveOnInterrupt().on_exception(trainer, None, KeyboardInterrupt())
    expected = f"resume with: lightning-grpo fit --config run.yaml --ckpt_path {tmp_path / 'epoch=0-step=4.ckpt'}"
    assert expected in str(warned[0].message)


def test_without_a_run_folder_the_checkpoint_goes_to_the_cache_not_the_working_directory(
    make_module, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []

    def stop_at_second(prompts, completions, **_):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [float(c.count("a")) for c in completions]

    trainer = make_trainer(max_steps=4, callbacks=[SaveOnInterrupt(export_adapter=False)])
    with pytest.raises(SystemExit):
        trainer.fit(make_module([stop_at_second]), prompt_loader(PROMPTS, repeat=4))
    assert not (tmp_path / "checkpoints").exists()
    assert [p.name for p in Path(tmp_path / "cache").rglob("*.ckpt")] == ["interrupted-step=1.ckpt"]
