"""A flat setting's old name (before GRPOConfig's settings were grouped) in a config or a flag: one line on stderr
naming its new place (after the one saying what the command loads), exit status 2, before anything is parsed or built;
no alias keeps the old name working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_grpo.cli import parse_config
from lightning_grpo.cli.misspelt_settings import misspelt_setting
from lightning_grpo.cli.moved_settings import moved_setting
from lightning_grpo.config import MOVED_SETTINGS
from tests.cli.conftest import FIT_LOADING, TINY
from tests.conftest import repo_pythonpath

ERROR = "python -m lightning_grpo fit: error: "
GROUPED = " (settings are grouped: docs/configuration.md)"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m lightning_grpo fit`` over the tiny config and ``args`` in ``tmp_path``, stdout and stderr apart."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath()}
    env.pop("LIGHTNING_GRPO_DEBUG", None)
    command = [sys.executable, "-m", "lightning_grpo", "fit", "--config", str(TINY), *args]
    command += [f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_an_old_key_in_a_yaml_config_is_one_line_naming_its_new_place(tmp_path):
    (tmp_path / "old.yaml").write_text("model:\n  init_args:\n    grpo:\n      temperature: 0.5\n")
    result = run(tmp_path, "--config", "old.yaml")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        FIT_LOADING,
        f"{ERROR}old.yaml: model.init_args.grpo.temperature moved to model.init_args.grpo.sampling.temperature"
        + GROUPED,
    ]
    assert result.stdout == "" and not list(tmp_path.rglob("version_*"))  # nothing seeded, built or written


def test_an_old_flag_is_one_line_naming_its_new_place(tmp_path):
    result = run(tmp_path, "--model.grpo.val_temperature=0.5")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        FIT_LOADING,
        f"{ERROR}--model.grpo.val_temperature moved to --model.grpo.validation.temperature{GROUPED}",
    ]
    assert result.stdout == "" and not list(tmp_path.rglob("version_*"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["fit", "--model.grpo.top_k=5"], "--model.grpo.top_k moved to --model.grpo.sampling.top_k"),
        (
            ["fit", "--model.init_args.grpo.kl_coef", "0.1"],
            "--model.init_args.grpo.kl_coef moved to --model.init_args.grpo.objective.kl_coef",
        ),
        (["fit", "--model.grpo", "{ppo_epochs: 2}"], "model.grpo.ppo_epochs moved to model.grpo.update.ppo_epochs"),
        (
            ["fit", "--model", '{"init_args": {"grpo": {"max_turns": 2}}}'],
            "model.init_args.grpo.max_turns moved to model.init_args.grpo.agents.max_turns",
        ),
        ({"model": {"grpo": {"rollout_backend": "vllm"}}}, "model.grpo.rollout_backend moved to model.grpo.backend."),
    ],
    ids=["flag", "init-args-flag", "inline-grpo", "inline-model", "dict-args"],
)
def test_every_way_of_giving_an_old_key_is_caught(args, expected):
    assert moved_setting(args).startswith(expected)
    assert moved_setting(args).endswith(GROUPED)


@pytest.mark.parametrize("where", ["model:\n  grpo:\n", "fit:\n  model:\n    init_args:\n      grpo:\n"])
def test_an_old_key_in_any_config_layout_is_caught(where, tmp_path):
    path = tmp_path / "old.yaml"
    indent = " " * (where.count("\n") * 2)
    path.write_text(f"{where}{indent}reward_timeout: 5\n")
    found = moved_setting(["--config", str(path), "fit"])
    assert found.startswith(f"{path}: ") and "grpo.reward_timeout moved to " in found
    assert "grpo.faults.reward_timeout" in found


def test_grouped_keys_and_the_shipped_configs_pass():
    assert moved_setting(["fit", "--config", str(TINY), "--model.grpo.sampling.temperature=0.5"]) is None
    assert moved_setting(["fit", "--model.grpo.help", "--model.init_args.grpo.update.ppo_epochs=2"]) is None
    assert moved_setting(["fit", "--config", "no-such-file.yaml", "--model.grpo", "{not yaml: ["]) is None


def test_every_old_name_has_a_new_place_and_none_works_as_an_alias():
    assert {"temperature", "val_temperature", "kl_coef", "micro_batch_size", "rollout_backend"} <= set(MOVED_SETTINGS)
    for old, new in MOVED_SETTINGS.items():
        assert moved_setting([f"--model.grpo.{old}=1"]) == (
            f"--model.grpo.{old} moved to --model.grpo.{new} (settings are grouped: docs/configuration.md)"
        )


def test_the_grouped_flag_sets_the_setting():
    config = parse_config(["fit", "--config", str(TINY), "--model.grpo.sampling.temperature=0.5"])
    assert config["fit"]["model.init_args.grpo.sampling.temperature"] == 0.5


def test_the_parsers_own_message_of_an_old_key_names_its_new_place_too():
    message = "Problem with given class_path 'lightning_grpo.GRPOConfig':\n    Option 'kl_coef' is not accepted"
    assert misspelt_setting(message, []) == f"grpo.kl_coef moved to grpo.objective.kl_coef{GROUPED}"
