"""A hung reward function: its timeout comes from GRPOConfig (or YAML), the run stops with an
error naming it, and the process exits."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lightning_grpo import GRPOConfig
from lightning_grpo.config import FaultConfig
from lightning_grpo.rewards import RewardFunctions
from tests.cli.run_process import REPO
from tests.conftest import repo_pythonpath

SCRIPT = """
import time
import torch
from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import FaultConfig, SamplingConfig
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.conftest import make_trainer, prompt_loader

def hangs(completions, **_):
    time.sleep(3600)

def fine(completions, **_):
    return [0.0] * len(completions)

tokenizer = build_tiny_tokenizer()
grpo = GRPOConfig(sampling=SamplingConfig(num_generations=2, max_new_tokens=2),
                  faults=FaultConfig(reward_timeout={"hangs": 0.5}))
module = GRPOModule(build_tiny_model(tokenizer), [hangs, fine], tokenizer=tokenizer, grpo=grpo,
                    policy=PolicyConfig(lora_r=2, lora_alpha=4), default_callbacks=False)
make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1="]))
"""


def test_a_hung_reward_stops_the_run_and_the_process_exits():
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": repo_pythonpath(), "HF_HUB_OFFLINE": "1", "PATH": ""},
    )  # fmt: skip
    assert result.returncode != 0
    assert "reward function 'hangs' did not finish within its timeout of 0.5 s" in result.stderr
    assert time.perf_counter() - start < 90  # the sleeping thread is a daemon: it does not hold the exit


def test_timeouts_are_checked_and_reach_the_reward_functions():
    with pytest.raises(ValueError, match=r"finite number > 0\.0"):
        GRPOConfig(faults=FaultConfig(reward_timeout=-1))
    with pytest.raises(ValueError, match=r"finite number > 0\.0"):
        GRPOConfig(faults=FaultConfig(reward_timeout={"judge": float("nan")}))
    config = GRPOConfig(faults=FaultConfig(reward_timeout=2.5))
    rewards = RewardFunctions.of([len], timeout=config.faults.reward_timeout)
    assert rewards.timeouts == (2.5,)
    with pytest.raises(ValueError, match="holds its weights and timeouts"):
        RewardFunctions.of(rewards, timeout=3)


def test_the_timeout_is_a_yaml_setting():
    from lightning_grpo.cli import parse_config

    tiny = str(REPO / "configs" / "debug" / "tiny.yaml")
    config = parse_config(["fit", "--config", tiny, "--model.init_args.grpo.faults.reward_timeout={math_answer: 30}"])
    assert config.fit.model.init_args.grpo.faults.reward_timeout == {"math_answer": 30.0}
