"""A checkpoint written before components had settings (flat ``grpo`` hyper-parameters, string loss kinds) resumes.

The fixture ``fixtures/flat_settings.ckpt`` was written by the code at 9c90f01
(``fixtures/make_flat_settings_checkpoint.py``): one GRPO iteration of the tiny model, the adapter only.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from lightning_grpo import GRPOConfig
from lightning_grpo.checkpoint.old_settings import upgrade_grpo_settings
from lightning_grpo.config import GROUPS, MOVED_SETTINGS
from tests.checkpoint.fixtures.make_flat_settings_checkpoint import HERE, build_module, fixture_config
from tests.conftest import make_trainer, prompt_loader

FIXTURE = HERE / "flat_settings.ckpt"


@pytest.fixture
def old_checkpoint(tmp_path: Path) -> Path:
    copy = tmp_path / FIXTURE.name
    shutil.copy(FIXTURE, copy)
    return copy


def _resume(module, path: Path, caplog) -> str:
    lightning_log = logging.getLogger("lightning.pytorch")  # Lightning's info lines do not propagate to the root
    lightning_log.addHandler(caplog.handler)
    try:
        trainer = make_trainer(max_steps=2)
        trainer.fit(module, prompt_loader(["1+1=", "2+2="], repeat=2), ckpt_path=path)
    finally:
        lightning_log.removeHandler(caplog.handler)
    assert trainer.global_step == 2  # the checkpoint's step 1, then one more
    return caplog.text


def test_the_fixture_is_small_and_of_the_old_format():
    assert FIXTURE.stat().st_size < 1_000_000
    saved = torch.load(FIXTURE, weights_only=True)["hyper_parameters"]["grpo"]
    assert "loss_kind_args" not in saved and saved["loss_kind"] == "clip" and saved["clip_high"] == 0.28
    # the old flat keys move into their groups (issue 63), the flat corrections (issue 53) in their component form
    upgraded = upgrade_grpo_settings(saved)
    assert set(upgraded) <= set(GROUPS) and not set(MOVED_SETTINGS) & set(upgraded)
    assert upgraded["sampling"]["num_generations"] == 4 and upgraded["objective"]["clip_high"] == 0.28
    assert upgraded["validation"] == {"num_generations": 1, "temperature": None, "success_threshold": 1.0}
    assert GRPOConfig(**upgraded) == fixture_config()


def test_an_old_checkpoint_resumes_without_edits_and_without_reported_changes(old_checkpoint, caplog):
    module = build_module()
    text = _resume(module, old_checkpoint, caplog)
    assert "changed settings" not in text  # no new setting reads as changed: absent means its default
    assert module.config.objective.policy_loss_settings().clip_high == 0.28


def test_a_changed_component_setting_is_reported_and_takes_effect_on_resume(old_checkpoint, caplog):
    module = build_module(objective={"loss_kind_args": {"clip_high": 0.3}})
    text = _resume(module, old_checkpoint, caplog)
    assert "grpo.objective.loss_kind_args None -> {'clip_high': 0.3}" in text
    assert module.config.component("loss_kind").keywords["clip_high"] == 0.3
