"""A new user's first commands: ``--help`` lists ``demo``; a mistake or a missing extra is named first, right after
the line that says what the command loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.cli.conftest import FIT_LOADING, REPO, TINY, quiet_run_args
from tests.cli.run_process import run_cli
from tests.conftest import repo_pythonpath


def test_help_lists_demo_among_the_available_subcommands(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    section = result.stdout.split("Available subcommands:", 1)[1]
    names = [match.group(1) for line in section.splitlines() if (match := re.match(r"^ {4}(\w+) ", line))]
    assert names[:5] == ["demo", "fit", "validate", "test", "predict"], section


def test_a_reward_returning_strings_is_named_on_the_first_lines(tmp_path):
    args = ["fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=1)[:3],
            "--model.init_args.reward_funcs=[tests.cli.helpers.string_reward]"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath()}
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run([sys.executable, "-m", "lightning_grpo", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    lines = [line for line in result.stdout.decode().split("\n") if line.strip()]  # a terminal's lines: "\r" stays
    assert lines[0] == FIT_LOADING, lines
    # then the progress bar's line (the error comes in the first iteration), then the error
    assert "reward function 'string_reward' returned a non-numeric value '1.0' (str)" in "\n".join(lines[1:3]), lines


def test_an_agent_without_openai_is_one_line_with_the_install_command_before_any_run(tmp_path):
    code = "import sys; sys.modules['openai'] = None\nfrom lightning_grpo.__main__ import main\nmain()\n"
    args = ["fit", "--config", str(TINY), "--model.init_args.agent=tests.rollout.test_agent_client._async_agent",
            "--model.init_args.reward_funcs=null", *quiet_run_args(tmp_path)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath()}
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    assert result.stdout.splitlines()[:2] == [
        "lightning-grpo fit: loading torch, Lightning, transformers and peft (10-20 s on 2 cores)...",
        "lightning-grpo fit: error: GRPOModule(agent=...) needs openai, which is not installed: pip install "
        '".[openai]" in a clone of lightning-grpo (pip install -e ".[openai]" for an editable install; from a built '
        'wheel: pip install "<the wheel file>[openai]")',
    ], result.stdout[-3000:]


def test_an_unknown_backend_setting_is_named_by_its_config_key(tmp_path):
    args = ["fit", "--config", str(TINY), *quiet_run_args(tmp_path),
            "--model.init_args.grpo.backend.rollout_backend=vllm",
            "--model.init_args.grpo.backend.rollout_backend_args={gpu_memory_utilization: 2}"]  # fmt: skip
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 1
    assert "error: model.init_args.grpo.backend.rollout_backend_args.gpu_memory_utilization" in result.stdout, (
        result.stdout
    )
