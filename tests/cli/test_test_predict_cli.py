"""``lightning-grpo test`` and ``lightning-grpo predict`` with a trained checkpoint (``--ckpt_path``): test reports
``test/reward_mean``, ``test/accuracy`` and ``test/pass@k``; predict writes a JSONL row per prompt and says where,
once."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from lightning_grpo.cli import GRPOCLI
from lightning_grpo.testing import make_task
from tests.cli.conftest import TINY, quiet_run_args
from tests.cli.run_process import run_cli

K = 2  # samples per prompt: grpo.validation.num_generations


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, warm_tiny_cache: None) -> tuple[Path, Path]:
    """A checkpoint of one GRPO iteration of the tiny config (fitted in this process), and a prompt file."""
    root = tmp_path_factory.mktemp("fit")
    with pytest.MonkeyPatch.context() as patch:  # before the tests' own _plain_argv: pytest's arguments are not ours
        patch.setattr(sys, "argv", ["lightning-grpo"])
        cli = GRPOCLI(args=["--config", str(TINY), *quiet_run_args(root, max_steps=1)], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    (checkpoint,) = root.glob("tiny/version_0/checkpoints/*.ckpt")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in make_task("addition", num_samples=6, seed=5)))
    return checkpoint, prompts


def run(subcommand: str, checkpoint: Path, data: str, root: Path, version: int = 0) -> tuple[str, Path]:
    """The subcommand on ``data`` (``--data.init_args.<name>=<file>``) in its own run folder; its output and folder."""
    result = run_cli(
        subcommand,
        "--config",
        str(TINY),
        f"--ckpt_path={checkpoint}",
        data,
        f"--model.init_args.grpo.validation.num_generations={K}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.enable_progress_bar=false",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"Loaded model weights from the checkpoint at {checkpoint}" in result.stdout  # the trained adapter
    return result.stdout, root / "tiny" / f"version_{version}"


def test_test_reports_the_validation_metrics_of_the_test_prompts(trained):
    checkpoint, prompts = trained
    fit_folder = checkpoint.parents[1]  # tested in the fit's own run folder: the fit's files must stay
    fit_metrics = (fit_folder / "metrics.csv").read_text()
    output, folder = run("test", checkpoint, f"--data.init_args.test_data={prompts}", fit_folder.parents[1], 1)
    assert (fit_folder / "metrics.csv").read_text() == fit_metrics and "train/reward_mean" in fit_metrics
    names = ("test/reward_mean", "test/accuracy", f"test/pass@{K}")
    assert all(name in output for name in names), output[-3000:]  # Lightning's table of test metrics
    with open(folder / "metrics.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert all(0.0 <= float(row[name]) <= 1.0 for name in names)
    assert float(row[f"test/pass@{K}"]) >= float(row["test/accuracy"])


def test_predict_writes_completions_and_rewards_per_prompt_and_says_where_once(trained, tmp_path):
    checkpoint, prompts = trained
    output, folder = run("predict", checkpoint, f"--data.init_args.predict_data={prompts}", tmp_path)
    path = folder / "predictions.jsonl"
    assert output.count(str(path)) == 1 and f"predictions: {path} (6 records)" in output, output[-3000:]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    assert all(len(row["completions"]) == len(row["rewards"]) == K for row in rows)
    assert {reward for row in rows for reward in row["rewards"]} <= {0.0, 1.0}  # math_answer with the answers given
