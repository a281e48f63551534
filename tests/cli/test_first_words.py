"""What the command line says first and last: the subcommands with ``demo``, GRPO's settings
before the Trainer's in ``fit --help``, no Lightning tips, where a fit's files went and the reward it gained."""

from __future__ import annotations

import csv
import io
import logging
import re
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo.cli import main
from lightning_grpo.demo import curve_title
from tests.cli.conftest import TINY, quiet_run_args, run_module


def test_no_arguments_name_every_subcommand_demo_included():
    result = run_module("lightning_grpo", timeout=300)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "usage: python -m lightning_grpo [-c CONFIG] {demo,fit,validate,test,predict} ..."
    assert lines[1].startswith("python -m lightning_grpo: error: no subcommand given: choose one of demo, fit,")
    assert len(lines) <= 3


def test_fit_help_opens_with_the_grpo_settings():
    result = run_module("lightning_grpo", "fit", "--help", timeout=300)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "GRPO settings only (the Trainer's options follow below):"
    assert "--model.help lightning_grpo.GRPOModule --model.grpo.help" in lines[2]


def test_lightning_tips_are_dropped_and_other_info_stays(tmp_path):
    logger, printed = logging.getLogger("lightning.pytorch.utilities.rank_zero"), io.StringIO()
    handler = logging.StreamHandler(printed)
    logger.addHandler(handler)
    try:
        Trainer(logger=CSVLogger(tmp_path), accelerator="cpu", enable_progress_bar=False)
        logger.info("another info line")
    finally:
        logger.removeHandler(handler)
    assert "Tip" not in printed.getvalue() and "litlogger" not in printed.getvalue()
    assert "another info line" in printed.getvalue()  # Lightning's other info lines stay
    available = "GPU available: True" in printed.getvalue() or "GPU available" not in printed.getvalue()
    assert available  # "GPU available: False, used: False" says nothing: dropped (callbacks/_quiet_lightning.py)


def test_a_fit_ends_saying_where_its_files_went_and_the_reward_it_gained(tmp_path, capsys):
    main(["fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=1)])
    lines = capsys.readouterr().out.strip().splitlines()[-6:]
    run = tmp_path / "tiny" / "version_0"
    assert lines[:5] == [
        "fit ended after 1 steps. Its files:",
        f"  metrics:      {run / 'metrics.csv'} (CSVLogger)",
        f"  checkpoint:   {run / 'checkpoints' / 'epoch=0-step=1.ckpt'}",
        f"  adapter:      {run / 'adapter' / 'final'}",
        f"  reward curve: {run / 'reward_curve.png'}",
    ]
    assert (run / "metrics.csv").exists() and (run / "adapter" / "final" / "adapter_config.json").exists()
    assert (run / "reward_curve.png").exists()
    with open(run / "metrics.csv", newline="") as handle:
        (reward,) = [float(row["train/reward_mean"]) for row in csv.DictReader(handle) if row["train/reward_mean"]]
    # the demo's line: the mean of the first and the last tenth (here the one iteration), then the seconds taken
    assert re.fullmatch(rf"fit: mean reward {reward:.2f} -> {reward:.2f} over 1 iteration \(\d+ s\)", lines[5]), lines


def test_the_reward_curve_is_titled_with_task_model_and_run():
    title = curve_title("addition", "Qwen2ForCausalLM", 8, Path("runs/tiny/version_3"))
    assert title == "GRPO on addition: Qwen2ForCausalLM, G=8 (run tiny/version_3)"
