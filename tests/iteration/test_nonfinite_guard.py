"""Non-finite loss or gradients: the step is not applied, the run stops (or skips, a few times)
with an error naming the step and the quantity, and nothing non-finite reaches a checkpoint or an adapter."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo import GRPOModule
from lightning_grpo.config import FaultConfig
from lightning_grpo.policy import NonFiniteError
from tests.conftest import make_trainer, prompt_loader


class NaNLossAt(GRPOModule):
    """The loss of the second GRPO iteration is NaN (as an overflow would make it)."""

    nan_iteration, iteration = 1, 0

    def on_train_batch_start(self, batch, batch_idx):
        self.iteration = batch_idx

    def compute_loss(self, batch, counts):
        loss, metrics = super().compute_loss(batch, counts)
        return (loss * float("nan") if self.iteration == self.nan_iteration else loss), metrics


class NaNGradientAt(Callback):
    """At one step, the gradient of every LoRA weight becomes NaN while the loss stays finite."""

    def __init__(self, step: int) -> None:
        self.step, self.handles = step, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            params = [p for p in pl_module.policy.parameters() if p.requires_grad]
            self.handles = [p.register_hook(lambda g: g * float("nan")) for p in params]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _adapter(module):
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


def _fit(module, tmp_path, steps=3, callbacks=()):  # 4 iterations of one optimizer step each
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer = make_trainer(max_steps=steps, enable_checkpointing=True, callbacks=[checkpoints, *callbacks])
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="], repeat=4))
    return trainer


class Snapshot(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.weights = _adapter(pl_module)


def test_a_nan_loss_stops_the_run_naming_the_step_and_nothing_is_applied(make_module, tmp_path):
    module, snapshot = make_module(module_cls=NaNLossAt), Snapshot()
    with pytest.raises(NonFiniteError, match=r"step 1: non-finite loss, gradient norm .*not applied.*Likely causes"):
        _fit(module, tmp_path, callbacks=[snapshot])
    for name, value in _adapter(module).items():
        torch.testing.assert_close(value, snapshot.weights[name])  # as after step 0: step 1 changed nothing
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == ["epoch=0-step=1.ckpt"]
    state = torch.load(tmp_path / "ckpt" / saved[0], weights_only=True)["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values())


def test_skip_mode_skips_the_step_with_a_warning_then_trains_on(make_module, tmp_path):
    module = make_module(module_cls=NaNLossAt, faults=FaultConfig(on_nonfinite="skip", max_skipped_steps=2))
    with pytest.warns(UserWarning, match="step 1: non-finite loss.*skipped \\(1 of 2\\)"):
        trainer = _fit(module, tmp_path)
    assert module.skipped_steps == [1] and trainer.global_step == 3  # 4 iterations: the skipped one took no step
    assert all(torch.isfinite(v).all() for v in _adapter(module).values())


def test_skips_are_limited(make_module, tmp_path):
    module = make_module(module_cls=NaNLossAt, faults=FaultConfig(on_nonfinite="skip", max_skipped_steps=0))
    with pytest.raises(NonFiniteError, match="step 1"):
        _fit(module, tmp_path)


def test_a_nan_gradient_with_a_finite_loss_is_named(make_module, tmp_path):
    with pytest.raises(NonFiniteError, match=r"step 2: non-finite gradient norm \(NaN or infinity\)"):
        _fit(make_module(), tmp_path, callbacks=[NaNGradientAt(2)])


def test_non_finite_weights_are_never_written(make_module, tmp_path):
    module = make_module()
    with torch.no_grad():
        next(p for p in module.policy.parameters() if p.requires_grad)[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="refusing to write the adapter"):
        module.export_adapter(tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()
    trainer = make_trainer(max_steps=1)
    trainer.strategy.connect(module)
    with pytest.raises(NonFiniteError, match="refusing to write a checkpoint: 1 non-finite value"):
        trainer.save_checkpoint(tmp_path / "bad.ckpt")
    assert not (tmp_path / "bad.ckpt").exists()


class NaNWeightAt(Callback):
    """A LoRA weight turns NaN before one step (memory corruption, a bad manual edit)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(p for n, p in pl_module.policy.named_parameters() if "lora_B" in n)[0, 0] = float("nan")


def test_a_weight_that_turned_nan_stops_the_run_naming_the_step(make_module, tmp_path):
    with pytest.raises(NonFiniteError, match="step 2"):
        _fit(make_module(), tmp_path, callbacks=[NaNWeightAt(2)])
    saved = torch.load(sorted((tmp_path / "ckpt").iterdir())[-1], weights_only=True)["state_dict"]
    assert all(torch.isfinite(v).all() for v in saved.values())
