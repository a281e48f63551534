"""Resuming mid-epoch from the command line: a run stopped by SIGTERM and resumed trains on the
prompts an uninterrupted run would have seen next, and Lightning does not warn that the data loader is not
resumable (it is: ``data.sampler.StreamLoader``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.callbacks.test_sigterm import _wait_for
from tests.cli.prompt_recorder import read_batches
from tests.cli.run_process import REPO, run_cli
from tests.conftest import repo_pythonpath

TINY = str(REPO / "configs" / "debug" / "tiny.yaml")
BATCHES_PER_EPOCH = 256 // 8  # the tiny config: 256 addition prompts, 8 per batch


def _args(root: Path, record: Path, max_steps: int) -> list[str]:
    recorder = {"class_path": "tests.cli.prompt_recorder.PromptRecorder", "init_args": {"path": str(record)}}
    return [
        "fit", "--config", TINY, f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
        f"--trainer.max_steps={max_steps}", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", f"--trainer.callbacks+={json.dumps(recorder)}",
    ]  # fmt: skip


def _stopped_run(root: Path) -> tuple[Path, int]:
    """A run stopped by SIGTERM after a few iterations: its checkpoint and the step it holds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": repo_pythonpath()}
    command = [sys.executable, "-m", "lightning_grpo", *_args(root, root / "prompts.jsonl", 100000)]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: len(read_batches(root / "prompts.jsonl")) >= 3, 180, [proc])
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, output[-3000:]
    (checkpoint,) = root.rglob("interrupted-step=*.ckpt")
    return checkpoint, torch.load(checkpoint, weights_only=True)["global_step"]


@pytest.mark.slow
@pytest.mark.usefixtures("warm_tiny_cache")
def test_a_run_resumed_mid_epoch_sees_the_prompts_a_straight_run_sees_next_without_a_warning(tmp_path):
    checkpoint, step = _stopped_run(tmp_path / "stopped")
    assert 0 < step < BATCHES_PER_EPOCH - 3, step  # stopped, and resumed below, inside the first epoch
    resumed_args = _args(tmp_path / "resumed", tmp_path / "resumed.jsonl", step + 3)
    resumed = run_cli(*resumed_args, "--ckpt_path", str(checkpoint))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    straight = run_cli(*_args(tmp_path / "straight", tmp_path / "straight.jsonl", step + 3))
    assert straight.returncode == 0, straight.stdout[-3000:]
    expected = read_batches(tmp_path / "straight.jsonl")
    stopped = read_batches(tmp_path / "stopped" / "prompts.jsonl")
    assert {i: stopped[i] for i in range(step)} == {i: expected[i] for i in range(step)}
    assert read_batches(tmp_path / "resumed.jsonl") == {i: expected[i] for i in range(step, step + 3)}
    assert "not resumable" not in resumed.stdout, resumed.stdout[-3000:]
