"""A bad setting value gives its cause first: the real command line, one kind of error per test.

The first line after the one saying what the command loads and Lightning's own info lines names the key as a config
writes it, the value, why and the fix; the whole output is a few lines, with no traceback unless ``--debug`` (or
``LIGHTNING_GRPO_DEBUG=1``) asks for one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_grpo import GRPOConfig
from lightning_grpo.cli.errors import explain_import, summarize_parse_error
from lightning_grpo.config import ObjectiveConfig, SamplingConfig
from tests.cli.conftest import FIT_LOADING, TINY
from tests.conftest import repo_pythonpath

#: Lines Lightning prints before any of ours (seeding, accelerators).
LIGHTNING_INFO = ("Seed set to", "GPU available", "TPU available", "HPU available", "💡 Tip")
HINT = "(add --debug or set LIGHTNING_GRPO_DEBUG=1 for the full message and traceback)"
REWARDS = """
def reward(completions, **kwargs):
    return [1.0 for _ in completions]


def words(completions, **kwargs):
    return ["good" for _ in completions]
"""


def run(tmp_path: Path, yaml: str, *args: str, debug: bool = False) -> tuple[int, list[str]]:
    """``python -m lightning_grpo fit`` over the tiny config and ``yaml``, in ``tmp_path``: exit status, lines after
    the first, which says what the command loads."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "bad.yaml").write_text(yaml)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath(), "PYTHONWARNINGS": "ignore"}
    env.pop("LIGHTNING_GRPO_DEBUG", None)
    command = [sys.executable, "-m", "lightning_grpo", "fit", "--config", str(TINY), "--config", "bad.yaml"]
    command += [*args, "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path}"]
    command += [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    command += ["--trainer.enable_model_summary=false", *(["--debug"] if debug else [])]
    result = subprocess.run(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )
    lines = result.stdout.splitlines()
    assert lines[0] == FIT_LOADING, result.stdout[-3000:]
    return result.returncode, lines[1:]


def first_line(lines: list[str]) -> str:
    """The first line that is not one of Lightning's info lines."""
    return next(line for line in lines if not line.startswith(LIGHTNING_INFO))


def grpo(group: str, setting: str) -> str:
    return f"model:\n  init_args:\n    grpo:\n      {group}:\n        {setting}\n"


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        (  # our own check, in GRPOConfig
            grpo("sampling", "num_generations: 1"),
            "python -m lightning_grpo fit: error: model.init_args.grpo.sampling.num_generations=1: the group "
            "estimator advantages.advantage_estimator='grpo' needs num_generations >= 2 (a group of one has no "
            "baseline); set sampling.num_generations to 2 or more (8 is usual)",
        ),
        (  # jsonargparse's choice error
            grpo("objective", "loss_agg_mode: token_mean"),
            "python -m lightning_grpo fit: error: model.init_args.grpo.objective.loss_agg_mode='token_mean': not one "
            "of 'token-mean', 'token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm'; "
            "did you mean 'token-mean'?",
        ),
        (  # jsonargparse's type error
            grpo("sampling", "max_new_tokens: three"),
            "python -m lightning_grpo fit: error: model.init_args.grpo.sampling.max_new_tokens='three': expected int; "
            "give a value of that type.",
        ),
        (  # an import path that does not resolve
            "model:\n  init_args:\n    reward_funcs: [lightning_grpo.rewards.math_answer, my_rewards.rewrd]\n",
            "python -m lightning_grpo fit: error: model.init_args.reward_funcs[1]='my_rewards.rewrd': cannot import "
            "it: 'my_rewards' has no 'rewrd'; did you mean 'my_rewards.reward'?",
        ),
        (  # an optimizer setting, checked before the model loads
            "model:\n  init_args:\n    optimizer: {class_path: torch.optim.AdamW, init_args: {lr: -0.002}}\n",
            "python -m lightning_grpo fit: error: model.init_args.optimizer.init_args.lr=-0.002: "
            "torch.optim.AdamW refuses it (Invalid learning rate: -0.002); give a learning rate > 0 (e.g. 1e-5)",
        ),
    ],
    ids=["own-check", "choice", "type", "import-path", "optimizer"],
)
def test_a_bad_value_is_one_line_with_its_key_value_cause_and_fix(tmp_path, yaml, expected):
    status, lines = run(tmp_path, yaml)
    assert status in (1, 2)
    assert first_line(lines) == expected, "\n".join(lines)
    assert lines[-1] == HINT and len(lines) <= 4, "\n".join(lines)  # Lightning's seed line, ours, the hint


def test_a_reward_returning_strings_names_the_row_first(tmp_path):
    status, lines = run(tmp_path, "model:\n  init_args:\n    reward_funcs: [my_rewards.words]\n")
    assert status == 1
    assert first_line(lines).startswith(
        "python -m lightning_grpo fit: error: reward function 'words' returned a non-numeric value 'good' (str) at "
        "row 0 (dataset row "
    ), "\n".join(lines)
    assert "prompt '" in first_line(lines) and "completion '" in first_line(lines)
    assert lines[-1] == HINT and len(lines) <= 10 and not any("Traceback" in line for line in lines)


def test_debug_keeps_the_full_message_and_traceback(tmp_path):
    status, lines = run(tmp_path, grpo("sampling", "num_generations: 1"), debug=True)
    assert status == 1 and "Traceback (most recent call last):" in lines
    shown = "\n".join(lines)
    assert "GRPOConfig.sampling.num_generations=1: the group estimator advantages.advantage_estimator='grpo'" in shown


def test_from_python_the_first_line_names_the_field_the_value_the_cause_and_the_fix():
    with pytest.raises(ValueError) as error:
        GRPOConfig(sampling=SamplingConfig(num_generations=1))
    assert str(error.value).splitlines()[0] == (
        "GRPOConfig.sampling.num_generations=1: the group estimator advantages.advantage_estimator='grpo' needs "
        "num_generations >= 2 (a group of one has no baseline); set sampling.num_generations to 2 or more (8 is usual)"
    )
    with pytest.raises(
        ValueError, match=r"^GRPOConfig.objective.loss_agg_mode='token_mean' is not valid; choose one of"
    ):
        GRPOConfig(objective=ObjectiveConfig(loss_agg_mode="token_mean"))
    with pytest.raises(TypeError, match=r"^GRPOConfig.sampling.top_k must be an integer >= 0, got 'a' \(str\)$"):
        GRPOConfig(sampling=SamplingConfig(top_k="a"))


def test_summaries_of_jsonargparse_messages():
    message = (
        "Parser key \"model\":\n  Errors:\n    - Problem with given class_path 'lightning_grpo.GRPOModule':\n"
        '        Parser key "policy":\n          Errors:\n'
        "            - Problem with given class_path 'lightning_grpo.PolicyConfig':\n"
        "                Parser key \"lora_r\":\n                  Expected a <class 'int'>. Got value: x\n"
    )
    assert (
        summarize_parse_error(message) == "model.init_args.policy.lora_r='x': expected int; give a value of that type."
    )
    assert summarize_parse_error("some other error") is None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("lightning_grpo.rewards.math_answer", ""),
        (
            "lightning_grpo.rewardz.math_answer",
            "'lightning_grpo' has no 'rewardz'; did you mean 'lightning_grpo.rewards'?",
        ),
        ("lightning_grpx.rewards", "no module named 'lightning_grpx'; did you mean 'lightning_grpo'?"),
    ],
)
def test_an_import_path_says_which_part_failed(path, expected):
    assert explain_import(path) == (f"cannot import it: {expected}" if expected else "")
