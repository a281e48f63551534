"""SIGTERM: a checkpoint of the last completed step and the adapter, the resume command, a
non-zero exit status; under DDP every rank stops after the same step. Signals go to real processes."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.cli.run_process import REPO
from tests.conftest import repo_pythonpath
from tests.distributed.launch import _env, _stop_session, free_port

TINY = str(REPO / "configs" / "debug" / "tiny.yaml")


def _wait_for(condition, timeout: float, procs) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the run never started training"
        assert all(p.poll() is None for p in procs), "a process ended before the signal"
        time.sleep(0.2)


@pytest.mark.usefixtures("warm_tiny_cache")
def test_sigterm_saves_a_resumable_checkpoint_and_exits_non_zero(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath()}
    root = [f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    args = [sys.executable, "-m", "lightning_grpo", "fit", "--config", TINY, *root, "--trainer.max_steps=100000"]
    args += ["--trainer.enable_progress_bar=false"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: list(tmp_path.rglob("hparams.yaml")), 120, [proc])
        time.sleep(3)  # a few steps
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, output[-3000:]
    (resume,) = re.findall(r"Resume with: (.*)", output)
    checkpoint = Path(re.search(r"--ckpt_path (\S+)", resume).group(1))
    step = torch.load(checkpoint, weights_only=True)["global_step"]
    assert step > 0 and checkpoint.name == f"interrupted-step={step}.ckpt"
    assert (tmp_path / "tiny" / "version_0" / "adapter" / f"interrupted-step-{step}" / "adapter_config.json").exists()
    assert resume.startswith("python -m lightning_grpo fit --config")
    command = [sys.executable, "-m", "lightning_grpo", *shlex.split(resume)[3:], f"--trainer.max_steps={step + 1}"]
    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]


def test_sigterm_under_ddp_stops_every_rank_after_the_same_step(tmp_path):
    port, procs, logs = free_port(), [], []
    for rank in range(2):
        logs.append((tmp_path / f"rank{rank}.log").open("w"))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.callbacks.sigterm_worker", str(tmp_path)], cwd=REPO,
            env=_env(rank, 2, port), stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
    try:
        _wait_for(lambda: all((tmp_path / f"started-{r}").exists() for r in range(2)), 150, procs)
        for proc in procs:  # as a scheduler does: every process of the job
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=90) for proc in procs]
    finally:
        for proc in procs:
            _stop_session(proc)
        for log in logs:
            log.close()
    text = [(tmp_path / f"rank{r}.log").read_text() for r in range(2)]
    assert codes == [143, 143], text
    (checkpoint,) = (tmp_path / "ckpt").glob("interrupted-step=*.ckpt")
    step = torch.load(checkpoint, weights_only=True)["global_step"]
    assert re.search(rf"Stopped by SIGTERM after step {step}: saved", text[0])
    assert [int((tmp_path / f"started-{r}").read_text()) for r in range(2)] == [step, step]
