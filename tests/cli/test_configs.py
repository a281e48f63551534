"""Every YAML under configs/ parses against the code; reward functions, optimizers and help come from the CLI."""

from __future__ import annotations

import importlib
import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from lightning_grpo.cli import GRPOCLI, main, parse_config
from tests.cli.conftest import REPO, TINY

CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))


def _without_missing_callbacks(path: Path, tmp_path: Path) -> Path:
    """The config, minus callbacks of lightning_grpo.callbacks that do not exist yet (they are written alongside)."""
    config = yaml.safe_load(path.read_text())
    callbacks = config.get("trainer", {}).get("callbacks") or []
    kept = [cb for cb in callbacks if _importable(cb["class_path"])]
    if len(kept) == len(callbacks):
        return path
    config["trainer"]["callbacks"] = kept
    copy = tmp_path / path.name
    copy.write_text(yaml.safe_dump(config))
    return copy


def _importable(class_path: str) -> bool:
    module, _, name = class_path.rpartition(".")
    if not module.startswith("lightning_grpo.callbacks"):
        return True  # anything else must import: the parser reports it
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def test_configs_exist():
    names = {str(path.relative_to(REPO)) for path in CONFIGS}
    assert {
        "configs/debug/tiny.yaml",
        "configs/qwen2.5-0.5b/gsm8k-lora.yaml",
        "configs/qwen2.5-0.5b/gsm8k-lora-vllm.yaml",
        "configs/qwen2.5-1.5b/gsm8k-lora.yaml",
        "configs/qwen2.5-7b/gsm8k-qlora.yaml",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_config_parses_against_the_code(path, tmp_path):
    config = parse_config(["fit", "--config", str(_without_missing_callbacks(path, tmp_path))])
    fit = config["fit"]
    assert fit.model.class_path.endswith("GRPOModule") or "init_args" in fit.model
    assert fit.data.class_path and fit.trainer.max_steps > 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_config_starts_with_its_purpose_and_command(path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ") and len(lines[0]) > 20, "first line: what the config is for"
    header = "\n".join(line for line in lines if line.startswith("#"))
    assert f"fit --config {path.relative_to(REPO)}" in header, "the header must give the exact command"


def test_the_7b_qlora_config_is_nf4_with_checkpointing_on_one_gpu_and_states_its_estimate():
    path = REPO / "configs/qwen2.5-7b/gsm8k-qlora.yaml"
    fit = parse_config(["fit", "--config", str(path)])["fit"]
    policy = fit.model.init_args.policy
    assert (policy.quantization, policy.target_modules, policy.gradient_checkpointing) == ("nf4", "all-linear", True)
    assert fit.trainer.devices == 1 and fit.trainer.precision == "32-true"
    header = " ".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert "estimated (not measured on a GPU)" in header and "GiB" in header


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--model.init_args.grpo.num_generation=4", "num_generation"),  # misspelt field
        ("--model.init_args.grpo.objective.loss_kind=ppo", "loss_kind"),  # not an allowed value
        ("--data.init_args.batchsize=4", "batchsize"),
        ("--trainer.max_step=4", "max_step"),
    ],
)
def test_unknown_keys_and_bad_values_fail(override, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["fit", "--config", str(TINY), override])
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err


def test_an_unknown_key_in_a_yaml_file_fails(tmp_path, capsys):
    config = yaml.safe_load(TINY.read_text())
    config["model"]["init_args"]["policy"]["lora_rank"] = 8
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit):
        parse_config(["fit", "--config", str(path)])
    assert "lora_rank" in capsys.readouterr().err


def test_print_config_output_parses_back_to_the_same_config(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(TINY), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = tmp_path / "printed.yaml"
    printed.write_text(out.getvalue())
    full = yaml.safe_load(out.getvalue())
    assert full["model"]["init_args"]["grpo"]["validation"]["success_threshold"] == 1.0  # defaults written out too
    assert full["model"]["init_args"]["reward_funcs"] == ["lightning_grpo.rewards.math_answer"]
    original = parse_config(["fit", "--config", str(TINY)])
    again = parse_config(["fit", "--config", str(printed)])
    drop_source = lambda config: {k: v for k, v in config["fit"].as_dict().items() if k != "config"}  # noqa: E731
    assert drop_source(again) == drop_source(original)


def test_help_shows_the_docstrings_of_grpo_and_policy_fields(capsys):
    shown = (
        ("grpo", "Completions sampled per prompt (G,"),  # the attribute docstrings under the fields
        ("grpo", "The policy loss's own settings"),
        ("grpo", "How a training rollout is sampled: group size"),  # a group's title: the docstring under it
        ("policy", "LoRA scaling numerator"),
        ("vllm", "Share of the GPU's memory vLLM may take"),
    )
    for section, text in shown:
        with pytest.raises(SystemExit):
            main(["fit", "--model.help", "lightning_grpo.GRPOModule", f"--model.{section}.help"])
        assert " ".join(capsys.readouterr().out.split()).count(text) == 1
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--model.help lightning_grpo.GRPOModule" in " ".join(capsys.readouterr().out.split())


def test_a_subcommand_without_a_config_fails_with_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--trainer.max_steps=3"])
    assert exit_info.value.code == 2
    assert "--config " in (err := capsys.readouterr().err) and "demo/tiny.yaml" in err


def test_reward_functions_optimizer_and_scheduler_from_yaml(tmp_path):
    rewards = (
        '{"exact": lightning_grpo.rewards.math_answer, "fmt": {"class_path": lightning_grpo.rewards.FormatReward, '
        '"init_args": {"pattern": "\\\\d+"}}, "long": {"class_path": lightning_grpo.rewards.OverlongPenalty, '
        '"init_args": {"max_length": 3, "buffer_length": 1}}}'
    )
    cli = GRPOCLI(
        args=[
            "--config", str(TINY), "--model.init_args.model.init_args.task=random",
            f"--model.init_args.reward_funcs={rewards}",
            "--model.init_args.reward_weights=[1.0, 0.5, 1.0]",
            "--model.init_args.lr_scheduler={class_path: torch.optim.lr_scheduler.StepLR, init_args: {step_size: 3}}",
            f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        run=False,
    )  # fmt: skip
    module = cli.model
    assert module.rewards.names == ("exact", "fmt", "long") and module.rewards.weights == (1.0, 0.5, 1.0)
    scores = module.rewards(["1+1="], ["2"], {"answer": ["2"]}, completion_lengths=[2])
    assert scores.per_function["fmt"].item() == 1.0 and scores.rewards.item() == pytest.approx(1.5)
    optimizers = module.configure_optimizers()
    optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    assert type(optimizer).__name__ == "AdamW" and optimizer.defaults["lr"] == 2.0e-4
    assert type(scheduler).__name__ == "StepLR" and scheduler.step_size == 3
    trainable = {id(p) for p in module.policy.parameters() if p.requires_grad}
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == trainable
