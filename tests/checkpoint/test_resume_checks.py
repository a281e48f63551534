"""Resuming: another policy's checkpoint is refused, a damaged file is named, changed settings take effect."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.checkpoint import CheckpointMismatchError, UnreadableCheckpointError
from lightning_grpo.config import ObjectiveConfig, SamplingConfig
from lightning_grpo.testing import build_tiny_model
from tests.conftest import count_a, make_trainer, prompt_loader

PROMPTS = ["1+1=", "2+2="]


@pytest.fixture
def checkpoint(make_module, tmp_path):
    """A checkpoint after one GRPO iteration of ``make_module()`` (LoRA r=4, lr 1e-2, StepLR gamma 0.5)."""
    module = make_module(lr_scheduler=_halving)
    saver = ModelCheckpoint(dirpath=tmp_path, filename="step{step}")
    make_trainer(max_steps=1, enable_checkpointing=True, callbacks=[saver]).fit(module, prompt_loader(PROMPTS))
    return saver.best_model_path


def _halving(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def _resume(module, path, max_steps=2):
    trainer = make_trainer(max_steps=max_steps)
    trainer.fit(module, prompt_loader(PROMPTS, repeat=2), ckpt_path=path)
    return trainer


def test_resuming_on_other_base_weights_is_refused_naming_both(tokenizer, checkpoint):
    other = GRPOModule(  # same architecture as make_module's, other weights (seed 1)
        build_tiny_model(tokenizer, seed=1),
        [count_a],
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling=SamplingConfig(num_generations=4, max_new_tokens=6)),
    )
    with pytest.raises(CheckpointMismatchError, match=r"same shapes, different weight values") as error:
        _resume(other, checkpoint)
    assert str(checkpoint) in str(error.value) and "'Qwen2ForCausalLM'" in str(error.value)


def test_resuming_with_another_lora_shape_is_refused_naming_the_setting(make_module, checkpoint):
    module = make_module(lr_scheduler=_halving, policy=PolicyConfig(lora_r=8, lora_alpha=8))
    with pytest.raises(CheckpointMismatchError, match=r"policy.lora_r: checkpoint 4, this run 8"):
        _resume(module, checkpoint)
    narrow = make_module(lr_scheduler=_halving, policy=PolicyConfig(lora_r=4, lora_alpha=8, target_modules=["q_proj"]))
    with pytest.raises(
        CheckpointMismatchError, match=r"target_modules: checkpoint \['down_proj'.*this run \['q_proj'\]"
    ):
        _resume(narrow, checkpoint)


def test_a_changed_learning_rate_and_kl_coef_take_effect_on_resume(make_module, checkpoint, caplog):
    module = make_module(lr=4e-3, lr_scheduler=_halving, objective=ObjectiveConfig(kl_coef=0.5))
    lightning_log = logging.getLogger("lightning.pytorch")  # Lightning's info lines do not propagate to the root
    lightning_log.addHandler(caplog.handler)
    try:
        trainer = _resume(module, checkpoint, max_steps=3)
    finally:
        lightning_log.removeHandler(caplog.handler)
    assert "grpo.objective.kl_coef 0.001 -> 0.5" in caplog.text and "lr 0.01 -> 0.004" in caplog.text
    assert trainer.global_step == 3
    assert module.optimizers().param_groups[0]["lr"] == pytest.approx(4e-3 * 0.5**3)  # the new lr, 3 halvings
    assert module.optimizers().optimizer.state  # the checkpoint's AdamW moments were restored, not reset


def _resume_logged(module, path, caplog) -> str:
    lightning_log = logging.getLogger("lightning.pytorch")  # Lightning's info lines do not propagate to the root
    lightning_log.addHandler(caplog.handler)
    try:
        _resume(module, path)
    finally:
        lightning_log.removeHandler(caplog.handler)
    return caplog.text


def test_a_setting_a_group_of_the_checkpoint_lacks_resumes_as_its_default(make_module, checkpoint, tmp_path, caplog):
    """A checkpoint written before a setting was added to a group (``sampling.top_k`` deleted from its nested
    ``grpo`` settings) resumes without a reported change: the defaults fill in at every depth."""
    data = torch.load(checkpoint, weights_only=True)
    sampling = data["hyper_parameters"]["grpo"]["sampling"]
    assert sampling["temperature"] == 1.0 and sampling["top_k"] == 0  # the settings are saved by group
    del sampling["top_k"]
    older = tmp_path / "older.ckpt"
    torch.save(data, older)
    assert "changed settings" not in _resume_logged(make_module(lr_scheduler=_halving), older, caplog)
    caplog.clear()
    sampling["top_k"] = 5  # the same checkpoint with another value: reported by its place
    torch.save(data, older)
    assert "grpo.sampling.top_k 5 -> 0" in _resume_logged(make_module(lr_scheduler=_halving), older, caplog)


def test_resuming_unchanged_keeps_the_checkpoints_optimizer_state(make_module, checkpoint):
    module = make_module(lr_scheduler=_halving)
    _resume(module, checkpoint, max_steps=2)
    assert module.optimizers().param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5**2)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: b"", "the file is empty"),
        (lambda data: data[: len(data) // 2], "truncated"),
        (lambda data: bytes(range(256)) * 8, "not a checkpoint written by Lightning"),
    ],
    ids=["empty", "truncated", "random-bytes"],
)
def test_a_damaged_checkpoint_names_the_file_and_never_suggests_weights_only_false(
    make_module, checkpoint, tmp_path, damage, reason
):
    bad = tmp_path / "damaged.ckpt"
    bad.write_bytes(damage(Path(checkpoint).read_bytes()))
    with pytest.raises(UnreadableCheckpointError) as error:
        _resume(make_module(lr_scheduler=_halving), bad)
    message = str(error.value)
    assert f"cannot read checkpoint {bad}" in message and reason in message
    assert "weights_only" not in message and error.value.__cause__ is None and error.value.__suppress_context__
