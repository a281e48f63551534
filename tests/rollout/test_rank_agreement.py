"""Single-process parts of the ranks' agreement on a rollout (the 2-rank cases are in tests/distributed): one process
pays nothing and sees its own error; a rank whose agents made no chat call gives an empty rollout only under several
ranks; ``collective_timeout_s`` refuses bad values and conflicting timeouts, naming the allowed values."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from lightning_grpo import GRPOConfig, distributed
from lightning_grpo.config import FaultConfig
from lightning_grpo.iteration.rank_rows import idle_minibatch
from lightning_grpo.iteration.types import UpdateBatch
from lightning_grpo.rollout import agent_wiring
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.agent_client import AgentLimits, NoAgentCallError
from lightning_grpo.rollout.rank_agreement import RankVotes, agreed_rollout
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.settings_checks import SettingError
from lightning_grpo.testing.agents import short_turn_model


def test_one_process_returns_the_result_and_raises_its_own_error_unchanged():
    assert agreed_rollout(lambda: [1, 2], None) == [1, 2]
    error = KeyError("prompt")

    def failing() -> None:
        raise error

    with pytest.raises(KeyError) as raised:
        agreed_rollout(failing, None)
    assert raised.value is error and raised.value.__cause__ is None
    assert RankVotes.of(lambda t: t, torch.device("cpu"), 0, 1) is None  # one process: no votes at all


async def _silent_agent(client, row):
    return 1.0  # no chat call


def _sample(tokenizer, ranks):
    rows = {"prompt": [[{"role": "user", "content": "hi"}]], "level": [3]}
    return agent_wiring.sample_batch(
        short_turn_model(tokenizer), tokenizer, rows, SamplingSettings(num_generations=2, max_new_tokens=4),
        AgentSettings.build(tokenizer), _silent_agent, session=None, max_prompt_length=64, limits=AgentLimits(),
        ranks=ranks,
    )  # fmt: skip


def test_agents_without_a_chat_call_fail_on_one_process_and_give_an_empty_rollout_under_ranks(tokenizer):
    with pytest.raises(NoAgentCallError, match="no agent execution made a chat call, so there is nothing to train on"):
        _sample(tokenizer, None)
    votes = []  # a fake 2-rank sum: the other rank sampled rows and nothing failed
    ranks = RankVotes(lambda t: votes.append(t.tolist()) or t, torch.device("cpu"), 1, 2)
    rollout, stats = _sample(tokenizer, ranks)
    assert len(rollout) == 0 and stats.executions == 2 and not stats.failures
    assert set(rollout.columns) == {"level", "agent_reward", "agent_trajectory", "agent_last", "agent_error"}
    assert votes == [[0.0, 0.0, 1.0]]  # one vote: not failed, empty
    batch = UpdateBatch(rollout, torch.zeros(0), rollout.sampled_mask, torch.zeros(0, 1), None)
    idle = idle_minibatch(batch)  # the rank still joins every update: one made-up row with an empty loss mask
    assert len(idle) == 1 and idle.loss_mask.sum() == 0 and idle.rollout.attention_mask.sum() == 2


@pytest.mark.parametrize("value", [0, 0.5, -1, float("nan"), float("inf"), 604801, "900", True])
def test_collective_timeout_refuses_values_outside_its_range(value):
    with pytest.raises((SettingError, TypeError), match=r"collective_timeout_s must be a finite number in \[1.0, "):
        GRPOConfig(faults=FaultConfig(collective_timeout_s=value))
    assert GRPOConfig(faults=FaultConfig(collective_timeout_s=None)).faults.collective_timeout_s is None
    assert GRPOConfig().faults.collective_timeout_s == 900.0


def test_collective_timeout_conflicts_are_refused_naming_both_values(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # no process group is touched before
    own = SimpleNamespace(_timeout=timedelta(hours=2))
    with pytest.raises(ValueError, match=r"timeout=2:00:00\) and GRPOConfig.faults.collective_timeout_s=900 disagree"):
        distributed.set_collective_timeout(own, 900.0)
    with pytest.raises(ValueError, match="collective_timeout_s=500 must exceed agent_timeout=600"):
        distributed.set_collective_timeout(SimpleNamespace(_timeout=None), 500.0, agent_timeout=600.0)
    distributed.set_collective_timeout(own, None)  # None keeps the strategy's own: nothing checked, nothing set
