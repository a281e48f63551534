"""``python -m lightning_grpo fit`` runs the tiny config, and a user's subclasses work from YAML."""

from __future__ import annotations

import csv
import re

import pytest
import yaml

from lightning_grpo.cli import main, parse_config
from tests.cli.conftest import REPO, TINY, quiet_run_args, run_module


def test_fit_with_the_tiny_config_from_the_command_line(tmp_path, warm_tiny_cache):
    result = run_module("lightning_grpo", "fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=2))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "tiny" / "version_0"
    with open(run_dir / "metrics.csv", newline="") as handle:
        steps = {row["step"] for row in csv.DictReader(handle) if row.get("train/reward_mean")}
    assert steps == {"0", "1"}
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())  # LightningCLI's record of the run
    model = saved["model"]["init_args"]["model"]
    assert model["class_path"] == "lightning_grpo.testing.TinyModel" and model["init_args"]["task"] == "addition"
    assert saved["torch_num_threads"] == 1
    assert (run_dir / "adapter" / "final" / "adapter_config.json").exists()  # beside the run, never overwritten
    assert result.stdout.splitlines()[-1].startswith("fit: mean reward "), result.stdout  # the demo's last line
    printed = result.stdout + result.stderr
    paths = ["metrics.csv", "checkpoints/epoch=0-step=2.ckpt", "adapter/final", "reward_curve.png"]
    assert {path: printed.count(str(run_dir / path)) for path in paths} == dict.fromkeys(paths, 1), printed


def test_console_script_entry_point_is_the_cli():
    # pyproject.toml, not the installed metadata: an editable install keeps the entry points it was installed with
    (script,) = re.findall(r'^lightning-grpo = "([^"]+)"', (REPO / "pyproject.toml").read_text(), flags=re.M)
    assert script == "lightning_grpo.__main__:main"
    from lightning_grpo.__main__ import main as entry

    with pytest.raises(SystemExit) as exit_info:  # everything but "demo" goes to the CLI
        entry(["fit", "--help"])
    assert exit_info.value.code == 0


def test_a_user_subclass_of_the_module_and_its_own_data_module_from_yaml(tmp_path):
    config = {
        "model": {
            "class_path": "tests.cli.helpers.ShortAnswerGRPO",
            "init_args": {
                "model": {"class_path": "lightning_grpo.testing.TinyModel"},
                "tokenizer": {"class_path": "lightning_grpo.testing.TinyTokenizer"},
                "reward_funcs": ["lightning_grpo.rewards.math_answer"],
                "length_penalty": 0.05,
                "grpo": {"sampling": {"num_generations": 4, "max_new_tokens": 3, "max_prompt_length": 8}},
                "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.01}},
            },
        },
        "data": {
            "class_path": "tests.cli.helpers.FixedPrompts",
            "init_args": {"prompts": ["1+1=", "2+3="], "answers": ["2", "5"], "batch_size": 2},
        },
        "trainer": {"accelerator": "cpu", "max_steps": 2, "logger": False, "default_root_dir": str(tmp_path)},
    }
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(config))
    from lightning_grpo.cli import GRPOCLI

    cli = GRPOCLI(args=["fit", "--config", str(path), "--trainer.enable_progress_bar=false"])
    assert type(cli.model).__name__ == "ShortAnswerGRPO" and cli.model.length_penalty == 0.05
    assert cli.model.calls == 2 and cli.trainer.global_step == 2
    assert type(cli.model.optimizers().optimizer).__name__ == "SGD"


def test_lightning_cli_optimizer_keys_are_refused_in_favour_of_the_module_argument(capsys):
    for key in ("--optimizer=torch.optim.Adam", "--lr_scheduler=torch.optim.lr_scheduler.StepLR"):
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", str(TINY), key])
        assert exit_info.value.code == 2
        name = key.split("=")[0].lstrip("-")
        assert f"error: unknown setting {name!r}" in capsys.readouterr().err  # no such top-level key
    parsed = parse_config(["fit", "--config", str(TINY), "--model.init_args.optimizer=torch.optim.Adam"])
    assert parsed.fit.model.init_args.optimizer.class_path == "torch.optim.Adam"  # the module's argument takes it
