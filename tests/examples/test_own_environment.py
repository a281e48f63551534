"""A user's own TRL-style environment, named by import path in YAML, trained from the command line on the tiny
tool-calling policy (examples/own_environment/; docs/agents.md, "Your own environment from YAML")."""

from __future__ import annotations

import csv

import pytest

from benchmarks.learning_cases import CASES
from tests.cli.conftest import quiet_run_args
from tests.cli.run_process import run_cli
from tests.examples.learning_claims import assert_claims

CONFIG = "examples/own_environment/fit.yaml"


def test_the_config_trains_the_environment_class_from_the_command_line(tmp_path):
    result = run_cli(
        "fit", "--config", CONFIG, *quiet_run_args(tmp_path, max_steps=2),
        "--model.init_args.model.init_args.warmup_steps=20",  # the recipe, shortened: this checks the wiring
        f"--model.init_args.model.init_args.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.splitlines()[-1].startswith("fit: mean reward "), result.stdout[-2000:]
    (metrics,) = tmp_path.glob("own_environment/version_0/metrics.csv")
    rows = [row for row in csv.DictReader(metrics.open()) if row.get("train/reward/Calculator")]
    assert len(rows) == 2  # the environment's get_reward is the reward, one value per iteration
    assert all(0.0 <= float(row["train/reward/Calculator"]) <= 1.0 for row in rows)
    assert all(float(row["train/agent/turns_mean"]) >= 1.0 for row in rows)  # sampled as agent turns


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(900)
def test_the_environment_learns_what_its_docs_claim(tmp_path):
    figures = CASES["own_environment"].run(0, tmp_path)
    assert_claims("own_environment", figures["first"], figures["last"])
