"""The adaptive entropy coefficient in a fit: logged, moved by the step's entropy, saved and restored on resume."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo import PromptDataModule
from lightning_grpo.algorithms.entropy import AdaptiveEntropy
from lightning_grpo.config import ObjectiveConfig
from tests.conftest import make_trainer, prompt_records

ADAPTIVE = {"entropy_control": "adaptive", "entropy_control_args": {"target": 50.0, "delta": 0.01}}  # always below


def _data():
    return PromptDataModule(prompt_records(8), batch_size=2, seed=1)


class _Record:
    def __init__(self):
        self.coefs, self.entropies = [], []

    def __call__(self, trainer, module, output, *_):
        self.coefs.append(float(output["metrics"]["entropy_coef"]))
        self.entropies.append(float(output["metrics"]["entropy"]))


def test_adaptive_coefficient_follows_the_rule_and_resumes(make_module, tmp_path):
    from lightning.pytorch.callbacks import LambdaCallback

    straight, record = make_module(objective=ObjectiveConfig(kl_coef=0.0, **ADAPTIVE)), _Record()
    make_trainer(max_steps=4, callbacks=[LambdaCallback(on_train_batch_end=record)]).fit(straight, _data())
    rule = AdaptiveEntropy(target=50.0, delta=0.01)
    expected = [rule(None)] + [rule(e) for e in record.entropies[:-1]]  # step k uses the coefficient of step k-1
    assert record.coefs == pytest.approx(expected) == [0.0, 0.01, 0.02, 0.03]
    assert straight.entropy_coef == pytest.approx(0.04)

    first = make_module(objective=ObjectiveConfig(kl_coef=0.0, **ADAPTIVE))
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    make_trainer(max_steps=2, enable_checkpointing=True, callbacks=[checkpoint]).fit(first, _data())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["entropy_control"]["coef"] == pytest.approx(0.02)
    assert saved["entropy_control"]["state"]["coef"] == pytest.approx(0.02)

    resumed = make_module(objective=ObjectiveConfig(kl_coef=0.0, **ADAPTIVE))
    assert resumed.entropy_coef == 0.0
    make_trainer(max_steps=2).fit(resumed, _data(), ckpt_path=tmp_path / "last.ckpt")  # restores, no step taken
    assert resumed.entropy_coef == pytest.approx(0.02) and resumed.entropy_control.coef == pytest.approx(0.02)
    make_trainer(max_steps=4).fit(resumed, _data(), ckpt_path=tmp_path / "last.ckpt")
    assert resumed.entropy_coef == pytest.approx(straight.entropy_coef)
    for name, param in straight.policy.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(dict(resumed.policy.named_parameters())[name], param, atol=1e-6, rtol=1e-5)


def test_constant_control_logs_its_coefficient_and_needs_no_state(make_module):
    module = make_module(objective=ObjectiveConfig(kl_coef=0.0, entropy_coef=0.03))
    make_trainer(max_steps=1).fit(module, _data())
    assert float(module.trainer.callback_metrics["train/entropy_coef"]) == pytest.approx(0.03)
