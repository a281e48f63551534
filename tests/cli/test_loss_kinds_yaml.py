"""The issue-37 policy losses chosen from a YAML config, with their own settings; a bad setting fails at once."""

from __future__ import annotations

import pytest
import yaml

from lightning_grpo.cli import GRPOCLI
from tests.cli.conftest import TINY, quiet_run_args


def _config(tmp_path, **groups) -> str:
    """The tiny config with ``groups`` of GRPO settings added (``objective={"loss_kind": "sapo"}``)."""
    config = yaml.safe_load(TINY.read_text())
    grpo = config["model"]["init_args"].setdefault("grpo", {})
    for group, settings in groups.items():
        grpo.setdefault(group, {}).update(settings)
    path = tmp_path / "loss.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_sapo_trains_from_yaml_and_logs_its_gate(tmp_path, warm_tiny_cache):
    objective = {"loss_kind": "sapo", "loss_kind_args": {"tau_pos": 0.5, "tau_neg": 2.0}}
    path = _config(tmp_path, objective=objective, update={"ppo_epochs": 2})
    cli = GRPOCLI(args=["fit", "--config", path, *quiet_run_args(tmp_path, max_steps=1)])
    assert cli.model.config.objective.loss_kind == "sapo"
    assert cli.model.config.component("loss_kind").keywords == {"tau_pos": 0.5, "tau_neg": 2.0}
    assert "train/sapo_gate_mean" in cli.trainer.callback_metrics


@pytest.mark.parametrize(
    ("kind", "args", "message"),
    [
        ("dppo_kl", {"threshold_high": 0.0}, "threshold_high must be a finite number > 0.0"),
        ("clip_cov", {"clip_cov_lb": 2.0, "clip_cov_ub": 1.0}, "clip_cov_ub must be a finite number > 2.0"),
    ],
)
def test_an_out_of_range_setting_names_loss_kind_args_when_the_config_is_built(tmp_path, kind, args, message):
    with pytest.raises(ValueError, match=f"loss_kind_args=.* is not valid: the policy loss kind '{kind}': {message}"):
        GRPOCLI(args=["--config", _config(tmp_path, objective={"loss_kind": kind, "loss_kind_args": args})], run=False)
