"""Shared pieces of the command-line, config, demo and example tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "debug" / "tiny.yaml"
#: The first line (stderr) of ``python -m lightning_grpo fit ...``, before the libraries load; the first error follows.
FIT_LOADING = "python -m lightning_grpo fit: loading torch, Lightning, transformers and peft (10-20 s on 2 cores)..."


def quiet_run_args(root: Path, max_steps: int = 2) -> list[str]:
    """Command-line overrides that keep a tiny run short and its files under ``root``."""
    return [
        f"--trainer.max_steps={max_steps}",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]


def run_module(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m <args>`` in the repository root, offline, with the output captured."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process CLI calls get their arguments explicitly; pytest's own must not look like CLI arguments."""
    monkeypatch.setattr(sys, "argv", ["lightning-grpo"])
