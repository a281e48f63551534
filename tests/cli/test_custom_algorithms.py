"""A policy loss, KL estimator and advantage estimator written outside the package, chosen from the command line."""

from __future__ import annotations

import re
from operator import attrgetter

import pytest
import torch
import yaml

from lightning_grpo.cli import GRPOCLI, parse_config
from tests.cli import helpers
from tests.cli.conftest import TINY, quiet_run_args

CUSTOM = {
    "objective.loss_kind": "tests.cli.helpers.reinforce_loss",
    "objective.kl_estimator": "tests.cli.helpers.squared_kl",
    "advantages.advantage_estimator": "tests.cli.helpers.centred_advantages",
}


def test_user_functions_train_through_the_cli(tmp_path, warm_tiny_cache, monkeypatch):
    monkeypatch.setattr(helpers, "CALLS", dict.fromkeys(helpers.CALLS, 0))
    overrides = [f"--model.init_args.grpo.{setting}={path}" for setting, path in CUSTOM.items()]
    cli = GRPOCLI(args=["fit", "--config", str(TINY), *overrides, *quiet_run_args(tmp_path, max_steps=2)])
    assert cli.trainer.global_step == 2
    assert {setting: attrgetter(setting)(cli.model.config) for setting in CUSTOM} == CUSTOM
    assert all(type(attrgetter(setting)(cli.model.config)) is str for setting in CUSTOM)  # plain data in checkpoints
    assert helpers.CALLS == {"loss": 2, "kl": 2, "advantages": 2}  # one micro-batch per step
    assert "train/clip_frac" in cli.trainer.callback_metrics  # the diagnostics still come from the loss's terms


def test_an_unknown_name_fails_when_the_config_is_parsed(capsys):
    with pytest.raises(SystemExit):  # neither a built-in name nor an import path
        parse_config(["fit", "--config", str(TINY), "--model.init_args.grpo.objective.loss_kind=ppo"])
    assert "loss_kind" in capsys.readouterr().err


def test_a_function_that_cannot_be_imported_fails_when_the_config_is_built():
    missing = "tests.cli.helpers.no_such_loss"
    with pytest.raises(ValueError, match=re.escape(f"cannot import the policy loss kind {missing!r}")):
        GRPOCLI(args=["--config", str(TINY), f"--model.init_args.grpo.objective.loss_kind={missing}"], run=False)


def test_a_user_loss_with_a_setting_of_its_own_trains_from_a_yaml_config(tmp_path, warm_tiny_cache, monkeypatch):
    monkeypatch.setattr(helpers, "SEEN_MAX_RATIO", [])
    config = yaml.safe_load(TINY.read_text())
    objective = config["model"]["init_args"].setdefault("grpo", {}).setdefault("objective", {})
    objective.update(loss_kind="tests.cli.helpers.capped_reinforce_loss", loss_kind_args={"max_ratio": 1.5})
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = GRPOCLI(args=["fit", "--config", str(path), *quiet_run_args(tmp_path, max_steps=2)])
    assert cli.trainer.global_step == 2
    assert helpers.SEEN_MAX_RATIO == [1.5, 1.5]  # the setting reached the loss, one micro-batch per step
    saved = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=True)["hyper_parameters"]["grpo"]
    assert saved["objective"]["loss_kind_args"] == {"max_ratio": 1.5}  # plain data in the checkpoint's hyper-parameters


def test_a_component_setting_it_does_not_take_fails_when_the_config_is_built():
    args = ["--config", str(TINY), "--model.init_args.grpo.objective.loss_kind=cispo",
            '--model.init_args.grpo.objective.loss_kind_args={"dual_clip": 2.0}']  # fmt: skip
    with pytest.raises(ValueError, match=r"takes no setting 'dual_clip'; its settings: clip_low, clip_high"):
        GRPOCLI(args=args, run=False)
