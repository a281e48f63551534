"""Runs the command line as a newcomer does: a real process, warnings shown, output captured in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import repo_pythonpath

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m lightning_grpo <args>`` offline, stderr merged into stdout (what a terminal shows, in order)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": repo_pythonpath()}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "lightning_grpo", *args], cwd=cwd or REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )  # fmt: skip
