"""A CLI run stopped by Ctrl-C or SIGTERM and resumed with the command it printed writes, in its ``metrics.csv``, what
an uninterrupted run writes: each step once, in order, with the same values (the ``step`` and ``epoch`` columns
included). The signal is sent by the process itself at a chosen point (:class:`tests.cli.signal_at.SignalAt`)."""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import pytest

from tests.cli.conftest import TINY, quiet_run_args
from tests.cli.run_process import run_cli

ITERATIONS = 6
SHORT_EPOCHS = ['--data.init_args.task_args={"num_samples": 32}']  # 4 iterations an epoch: the stops cross its end
VOLATILE = ("time", "per_sec", "memory", "total_")  # clocks, and the throughput totals counted since the run started


def _args(root: Path) -> list[str]:
    return ["fit", "--config", str(TINY), *quiet_run_args(root, max_steps=ITERATIONS), *SHORT_EPOCHS]


def _rows(root: Path) -> list[dict[str, str]]:
    with open(root / "tiny" / "version_0" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [{k: v for k, v in row.items() if not any(word in k for word in VOLATILE)} for row in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, warm_tiny_cache: None) -> list[dict[str, str]]:
    """The rows of an uninterrupted run."""
    root = tmp_path_factory.mktemp("straight")
    run = run_cli(*_args(root), cwd=root)
    assert run.returncode == 0, run.stdout[-3000:]
    return _rows(root)


def _stop_and_resume(root: Path, iteration: int, phase: str, name: str, code: int, saved: int) -> list[dict[str, str]]:
    """Stop a run with signal ``name`` at ``phase`` of ``iteration``, check what it saved, run the printed resume
    command (without the test's signal), and return the rows of the run folder's ``metrics.csv``."""
    hook = {"class_path": "tests.cli.signal_at.SignalAt", "init_args": {"iteration": iteration, "phase": phase}}
    hook["init_args"]["signal"] = name
    stopping = [*_args(root), f"--trainer.callbacks+={json.dumps(hook)}"]
    stopped = run_cli(*stopping, cwd=root)
    assert stopped.returncode == code, stopped.stdout[-3000:]
    checkpoint = root / "tiny" / "version_0" / "checkpoints" / f"interrupted-step={saved}.ckpt"
    (printed,) = re.findall(r"Resume with: (.*)", stopped.stdout)
    assert shlex.split(printed) == ["python", "-m", "lightning_grpo", *stopping, "--ckpt_path", str(checkpoint)]
    assert [row["step"] for row in _rows(root)] == [str(step) for step in range(saved)]  # no row of a later step
    resumed = run_cli(*_args(root), "--ckpt_path", str(checkpoint), cwd=root)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    return _rows(root)


def test_ctrl_c_while_scoring_then_the_resume_command_writes_each_step_once(tmp_path, straight):
    # Ctrl-C after iteration 3 (the last of epoch 0) has sampled and scored, before its update: the checkpoint holds
    # iterations 0-2 and rows 0-2 are written; the resumed run repeats iteration 3 as step 3 (not 4), in epoch 0
    rows = _stop_and_resume(tmp_path, iteration=3, phase="backward", name="SIGINT", code=1, saved=3)
    assert rows == straight


def test_sigterm_during_an_update_then_the_resume_command_writes_each_step_once(tmp_path, straight):
    # SIGTERM during iteration 3's update: the iteration finishes and writes its row (it was lost), epoch 0 ends, and
    # the run stops as iteration 4 (the first of epoch 1) starts, with status 143
    rows = _stop_and_resume(tmp_path, iteration=3, phase="update", name="SIGTERM", code=143, saved=4)
    assert rows == straight
