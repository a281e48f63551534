"""A newcomer's first commands: ``lightning-grpo --help`` and ``lightning-grpo demo``."""

from __future__ import annotations

import pytest

from lightning_grpo.testing import TinyModel
from tests.cli.run_process import run_cli

#: What must never come before the demo's own first line.
NOISE = ("args parameter is intended", "loss_type", "FutureWarning", "Tip:", "Seed set to")


def test_help_names_the_demo_and_the_packaged_config(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "configs/debug/tiny.yaml" not in result.stdout  # a wheel install has no configs/ folder
    assert "lightning-grpo demo" in result.stdout or "lightning_grpo demo" in result.stdout


def test_a_subcommand_without_a_config_names_the_packaged_one(tmp_path):
    result = run_cli("fit", cwd=tmp_path)
    assert result.returncode == 2
    assert "configs/debug/tiny.yaml" not in result.stdout and "demo/tiny.yaml" in result.stdout


@pytest.mark.usefixtures("warm_tiny_cache")
def test_the_demo_speaks_first(tmp_path):
    result = run_cli("demo", "--max-steps", "2", "--output-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("demo:"))
    before = "\n".join(lines[:first])
    assert not [noise for noise in NOISE if noise in before], before
    assert "mean reward" in lines[-1]


def test_the_tiny_model_names_its_loss():
    assert TinyModel().loss_type == "ForCausalLM"  # transformers would log that it does not know the loss


def test_bitsandbytes_hub_kernel_hint_is_dropped_and_nothing_else(caplog):
    import logging

    import lightning_grpo  # noqa: F401 - installs the filter

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please ...", "no kernels")
        logger.warning("another bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["another bitsandbytes warning"]
