"""A checkpoint written with the flat correction settings (before issue 53) resumes under their component form.

The fixture ``fixtures/flat_corrections.ckpt`` was written at d4e1536 (``fixtures/make_flat_corrections_checkpoint.py``)
with ``rollout_correction_min``/``_max``, ``rollout_rejection_min``/``_max``, ``off_policy_mask_threshold``,
``importance_weighted_kl`` and ``top_entropy_quantile``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from lightning_grpo import GRPOConfig
from lightning_grpo.checkpoint.old_settings import FLAT_CORRECTION_KEYS, upgrade_grpo_settings
from lightning_grpo.config import GROUPS
from tests.checkpoint.fixtures.make_flat_corrections_checkpoint import FLAT
from tests.checkpoint.fixtures.make_flat_settings_checkpoint import HERE, build_module, fixture_config
from tests.conftest import make_trainer, prompt_loader

FIXTURE = HERE / "flat_corrections.ckpt"
#: ``FLAT`` in today's settings, by group.
COMPONENTS = {
    "corrections": {
        "rollout_correction": "token_mask", "rollout_correction_args": {"min": 0.5, "max": 2.0},
        "rollout_rejection": "geometric", "rollout_rejection_args": {"min": 0.25, "max": 4.0},
        "off_policy_mask": "opsm", "off_policy_mask_args": {"threshold": 0.5},
    },
    "objective": {
        "kl_weighting": "importance", "token_selection": "top_entropy", "token_selection_args": {"quantile": 0.5},
        "kl_coef": 0.01,
    },
}  # fmt: skip


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
    assert trainer.global_step == 2
    return caplog.text


def test_the_fixture_holds_the_flat_settings_and_they_map_to_the_components():
    saved = torch.load(FIXTURE, weights_only=True)["hyper_parameters"]["grpo"]
    assert {key: saved[key] for key in FLAT} == FLAT and set(FLAT_CORRECTION_KEYS) <= set(saved)
    upgraded = upgrade_grpo_settings(saved)
    assert set(upgraded) <= set(GROUPS)  # every setting in its group
    assert not set(FLAT_CORRECTION_KEYS) & {key for group in upgraded.values() for key in group}
    assert GRPOConfig(**upgraded) == fixture_config(**COMPONENTS)


def test_tis_cap_maps_to_token_truncate_and_defaults_map_to_nothing():
    assert upgrade_grpo_settings({"tis_cap": 1.5, "rollout_correction": None}) == {
        "corrections": {"rollout_correction": "token_truncate", "rollout_correction_args": {"max": 1.5}}
    }  # fmt: skip
    defaults = {"tis_cap": None, "rollout_correction": None, "rollout_correction_min": None,
                "rollout_correction_max": 3.0, "rollout_rejection": None, "rollout_rejection_min": 0.5,
                "rollout_rejection_max": 2.0, "off_policy_mask_threshold": None, "importance_weighted_kl": False,
                "top_entropy_quantile": 1.0, "kl_coef": 0.1}  # fmt: skip
    assert upgrade_grpo_settings(defaults) == {
        "corrections": {"rollout_correction": None, "rollout_rejection": None}, "objective": {"kl_coef": 0.1}
    }  # fmt: skip
    assert upgrade_grpo_settings({"kl_coef": 0.1}) == {"objective": {"kl_coef": 0.1}}  # a flat setting: to its group
    assert upgrade_grpo_settings({"objective": {"kl_coef": 0.1}}) == {"objective": {"kl_coef": 0.1}}  # today's form


def test_the_old_checkpoint_resumes_under_the_components_without_reported_changes(old_checkpoint, caplog):
    module = build_module(**COMPONENTS)
    text = _resume(module, old_checkpoint, caplog)
    assert "changed settings" not in text


def test_a_changed_correction_is_reported_in_todays_names(old_checkpoint, caplog):
    module = build_module(
        **{**COMPONENTS, "corrections": {**COMPONENTS["corrections"], "off_policy_mask_args": {"threshold": 0.25}}}
    )
    text = _resume(module, old_checkpoint, caplog)
    assert (
        "grpo.corrections.off_policy_mask_args.threshold 0.5 -> 0.25" in text
        and "off_policy_mask_threshold" not in text
    )
