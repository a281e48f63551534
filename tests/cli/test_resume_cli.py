"""Resuming through the command line from an explicit checkpoint file (docs/distributed.md, "Resuming")."""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

from tests.cli.conftest import TINY, quiet_run_args, run_module


def _first_run(root: Path) -> Path:
    """Two iterations of the tiny config; the checkpoint file Lightning wrote at the end."""
    result = run_module("lightning_grpo", "fit", "--config", str(TINY), *quiet_run_args(root, max_steps=2))
    assert result.returncode == 0, result.stderr[-3000:]
    (checkpoint,) = sorted(root.rglob("*.ckpt"))
    return checkpoint


def _steps(run_dir: Path) -> set[str]:
    with open(run_dir / "metrics.csv", newline="") as handle:
        return {row["step"] for row in csv.DictReader(handle) if row.get("train/loss")}


def test_resume_from_a_checkpoint_file_with_a_changed_kl_coef(tmp_path, warm_tiny_cache):
    checkpoint = _first_run(tmp_path / "first")
    args = quiet_run_args(tmp_path / "second", max_steps=4)
    result = run_module(
        "lightning_grpo", "fit", "--config", str(TINY), *args,
        "--model.init_args.grpo.objective.kl_coef=0.5", "--ckpt_path", str(checkpoint),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "second" / "tiny" / "version_0"
    assert _steps(run_dir) == {"2", "3"}  # continued from step 2, not restarted
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["init_args"]["grpo"]["objective"]["kl_coef"] == 0.5  # the changed setting took effect


def test_resume_with_another_lora_rank_is_refused_naming_the_setting(tmp_path, warm_tiny_cache):
    checkpoint = _first_run(tmp_path / "first")
    args = quiet_run_args(tmp_path / "second", max_steps=4)
    result = run_module(
        "lightning_grpo", "fit", "--config", str(TINY), *args,
        "--model.init_args.policy.lora_r=4", "--ckpt_path", str(checkpoint),
    )  # fmt: skip
    assert result.returncode != 0
    assert "lora_r" in result.stderr
