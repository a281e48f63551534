"""An example whose extra is missing stops at once with the install line, before any warm-up or training."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import REPO

#: Runs ``python -m examples.<name>`` with the given modules made unimportable (as if never installed).
_BLOCKED_RUN = (
    "import runpy, sys\n"
    "for name in sys.argv[2].split(','):\n"
    "    sys.modules[name] = None\n"
    "example = sys.argv[1]\n"
    "sys.argv = [example, *sys.argv[3:]]\n"
    "runpy.run_module(example, run_name='__main__')\n"
)


def run_without(example: str, blocked: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m <example> <args>`` with the modules ``blocked`` (comma-separated) missing; output and seconds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, example, blocked, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=120,
    )  # fmt: skip
    return result, time.perf_counter() - start


@pytest.mark.parametrize(
    ("example", "blocked", "args", "line"),
    [
        ("examples.openai_agent", "openai", (), 'openai_agent needs openai, which is not installed: pip install'),
        ("examples.openai_agent", "openai", ("--transport", "in_process"), 'pip install ".[openai]" in a clone'),
        ("examples.mcp_tools", "mcp", (), 'mcp_tools needs mcp, which is not installed: pip install ".[mcp]"'),
        ("examples.gsm8k_lora", "datasets", (),
         'gsm8k_lora needs datasets, which is not installed: pip install ".[data]"'),
    ],
)  # fmt: skip
def test_an_example_without_its_extra_names_the_install_line_first(example, blocked, args, line):
    result, seconds = run_without(example, blocked, *args)
    assert result.returncode == 1, result.stdout
    loading, error = result.stdout.splitlines()[:2]  # what it loads, then the cause
    assert loading.endswith(": loading torch, Lightning, transformers and peft (10-20 s on 2 cores)..."), loading
    assert line in error, result.stdout
    assert "Traceback" not in result.stdout and "warm" not in result.stdout.lower()
    assert seconds < 60  # an import and a check, not a warm-up (95 s before the fix)


@pytest.mark.parametrize("name", ["openai_agent", "mcp_tools", "gsm8k_lora"])
def test_each_example_with_an_extra_names_it_in_its_docstring(name):
    text = (REPO / "examples" / f"{name}.py").read_text(encoding="utf-8").split('"""')[1]
    assert 'pip install -e ".[' in text and "extra" in text
