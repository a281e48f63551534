"""A user's own TRL-style environment, named by import path in YAML, trained from the command line on the tiny
tool-calling policy (examples/own_environment/; docs/agents.md, "Your own environment from YAML")."""

from __future__ import annotations

import csv

import pytest

from benchmarks.learning_cases import CASES
from tests.examples.learning_claims import assert_claims


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(900)
def test_the_environment_learns_what_its_docs_claim(tmp_path):
    """The config run as ``lightning-grpo fit`` runs it (seed 0): the class's ``get_reward`` is the reward, sampled in
    agent turns, and it rises as docs/agents.md claims (every seed: docs/benchmarks.md, "Learning over 10 seeds")."""
    figures = CASES["own_environment"].run(0, tmp_path)
    assert_claims("own_environment", figures["first"], figures["last"])
    (metrics,) = tmp_path.glob("own_environment/version_0/metrics.csv")
    rows = [row for row in csv.DictReader(metrics.open()) if row.get("train/reward/Calculator")]
    assert len(rows) == 60 and all(0.0 <= float(row["train/reward/Calculator"]) <= 1.0 for row in rows)
    assert float(rows[-1]["train/agent/tool_calls_mean"]) > float(rows[0]["train/agent/tool_calls_mean"])
