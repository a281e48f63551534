"""The examples print what they say: first and last rewards, a reward, defaults in --help."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from tests.cli.conftest import REPO
from tests.examples.test_examples import load_example

EXAMPLES = ["custom_reward", "subclass_step", "gsm8k_lora", "tool_calling", "multi_turn_env"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_shows_the_defaults(name, capsys):
    with pytest.raises(SystemExit):
        load_example(name).parse(["--help"])
    assert "(default: " in capsys.readouterr().out


_LIBRARIES = {"torch", "lightning", "transformers", "peft", "lightning_grpo"}


def _imports_a_library(node: ast.stmt) -> bool:
    """Whether ``node`` imports torch, Lightning, transformers, peft or the package (the announcement's own import
    of ``lightning_grpo.cli.before_loading`` aside: it loads none of them)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module != "lightning_grpo.cli.before_loading":
        names = [node.module or ""]
    else:
        return False
    return any(name.split(".")[0] in _LIBRARIES for name in names)


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.py")), ids=lambda path: path.stem)
def test_each_example_says_what_it_loads_before_it_imports_a_library(path):
    body = ast.parse(path.read_text()).body
    announced = next(i for i, node in enumerate(body) if "announce_libraries(" in ast.unparse(node))
    first_import = next(i for i, node in enumerate(body) if _imports_a_library(node))
    assert announced < first_import, path.name
    assert f"announce_libraries('examples/{path.name}')" in ast.unparse(body[announced])


def test_an_example_run_as_a_script_prints_its_loading_line_first():
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "custom_reward.py"), "--help"], capture_output=True, text=True,
        cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.splitlines()[0] == (
        "examples/custom_reward.py: loading torch, Lightning, transformers and peft (10-20 s on 2 cores)..."
    )


def test_custom_reward_prints_the_first_and_last_rewards(tmp_path, warm_tiny_cache, capsys):
    args = ["--max-steps", "3", "--num-generations", "4", "--batch-size", "4", "--output-dir", str(tmp_path)]
    load_example("custom_reward").main([*args, "--no-progress-bar"])
    assert re.search(r"custom_reward: mean reward \d\.\d\d -> \d\.\d\d over 3 steps", capsys.readouterr().out)


def test_subclass_step_prints_a_reward(warm_tiny_cache, capsys):
    load_example("subclass_step").main(["--max-steps", "2", "--num-generations", "4", "--batch-size", "4",
                                        "--no-progress-bar"])  # fmt: skip
    assert re.search(r"mean reward \d\.\d\d, mean completion length", capsys.readouterr().out)


class _WarmedUp(Exception):
    """Stops an example's ``build`` where its warm-up would start."""


@pytest.mark.parametrize(
    ("name", "warm_up", "traces"),
    [
        ("tool_calling", "warm_policy", "tool-call traces"),
        ("mcp_tools", "warm_policy", "tool-call traces"),
        ("openai_agent", "warm_policy", "tool-call traces"),
        ("multi_turn_env", "warm_up_on_traces", "guessing games"),
    ],
)
def test_the_warm_up_says_what_it_does_and_how_long_before_it_starts(name, warm_up, traces, capsys, monkeypatch):
    example = load_example(name)
    said: list[str] = []

    def stop(*_, **__):
        said.append(capsys.readouterr().err)  # what stderr showed when the warm-up began
        raise _WarmedUp

    monkeypatch.setattr(example, warm_up, stop)
    with pytest.raises(_WarmedUp):
        example.build(example.parse(["--warmup-steps", "1600"]))
    assert said == [
        f"{name}: warming the tiny policy up on {traces} (1600 supervised steps, about 20 s on an idle CPU core)\n"
    ]
