"""AgentStats: turn, tool and context-token metrics of a hand-built multi-turn rollout, and silence for single turn."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_grpo.callbacks import AgentStats, default_callbacks
from lightning_grpo.callbacks.agent_stats import agent_metrics
from lightning_grpo.rollout.batch import Rollout, TurnStats


class LogSink:
    """Stands in for the LightningModule: keeps what ``log_dict`` receives."""

    def __init__(self) -> None:
        self.logged: dict[str, torch.Tensor] = {}

    def log_dict(self, metrics: dict[str, torch.Tensor], **_: Any) -> None:
        self.logged.update(metrics)


def _rollout(turns: TurnStats | None) -> Rollout:
    # Row 0: 2 sampled, 3 tool tokens, 1 sampled; row 1: 2 sampled, padding; row 2: 1 sampled, 2 inserted, 1 sampled.
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    sampled_mask = torch.tensor([[1, 1, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0]])
    return Rollout(
        prompt_ids=torch.ones(3, 2, dtype=torch.long),
        prompt_mask=torch.ones(3, 2, dtype=torch.long),
        completion_ids=torch.arange(18).view(3, 6),
        completion_mask=completion_mask,
        truncated=torch.tensor([False, False, True]),
        group_ids=torch.tensor([0, 0, 0]),
        prompts=[[{"role": "user", "content": "q"}]] * 3,
        completions=[[], [], []],
        sampled_mask=sampled_mask if turns is not None else None,
        turns=turns,
    )


def _turns() -> TurnStats:
    return TurnStats(
        num_turns=torch.tensor([2, 1, 3]),
        tool_calls=torch.tensor([2, 0, 3]),
        tool_errors=torch.tensor([1, 0, 1]),
        tool_timeouts=torch.tensor([0, 0, 1]),
        max_turns_reached=torch.tensor([False, False, True]),
        turn_rewards=[[1.0, 0.5], [2.0], [0.0, None, 4.0]],
    )


def test_values_are_exact_on_a_hand_built_rollout():
    sink = LogSink()
    AgentStats().on_train_batch_end(None, sink, {"rollout": _rollout(_turns())}, None, 0)
    expected = {
        "turns_mean": 6 / 3,
        "tool_calls_mean": 5 / 3,
        "tool_error_rate": 2 / 5,
        "tool_timeout_rate": 1 / 5,
        "context_token_frac": 5 / 12,  # 3 + 0 + 2 inserted tokens over 6 + 2 + 4 trajectory tokens
        "max_turns_frac": 1 / 3,
        "turn_reward_mean/0": 3.0 / 3,
        "turn_reward_mean/1": 0.5,  # the None of row 2 is not counted
        "turn_reward_mean/2": 4.0,
    }
    assert sorted(sink.logged) == sorted(f"train/agent/{name}" for name in expected)
    for name, value in expected.items():
        torch.testing.assert_close(sink.logged[f"train/agent/{name}"], torch.tensor(value, dtype=torch.float32))


def test_no_tool_calls_and_no_environment_rewards():
    turns = _turns()
    turns.tool_calls, turns.tool_errors, turns.tool_timeouts = (torch.zeros(3, dtype=torch.long),) * 3
    turns.turn_rewards = [[], [], []]
    metrics = agent_metrics(_rollout(turns))
    assert metrics["tool_error_rate"] == 0 and metrics["tool_timeout_rate"] == 0
    assert not any(name.startswith("turn_reward_mean") for name in metrics)


def test_single_turn_rollouts_log_nothing():
    sink = LogSink()
    AgentStats(prefix="val/").on_train_batch_end(None, sink, {"rollout": _rollout(None)}, None, 0)
    assert sink.logged == {}
    with pytest.raises(ValueError, match="multi-turn rollout"):
        agent_metrics(_rollout(None))


def test_is_a_default_callback_and_checks_its_arguments():
    assert any(isinstance(cb, AgentStats) for cb in default_callbacks())
    with pytest.raises(TypeError, match="prefix must be a string"):
        AgentStats(prefix=None)
    with pytest.raises(TypeError, match="AgentStats reads the StepOutput"):
        AgentStats().on_train_batch_end(None, LogSink(), {"loss": 1.0}, None, 0)


def test_validation_metrics_cover_the_whole_epoch():
    from types import SimpleNamespace

    callback, sink = AgentStats(), LogSink()
    trainer = SimpleNamespace(sanity_checking=False)
    callback.on_validation_epoch_start(trainer, sink)
    one, two = _turns(), _turns()
    two.num_turns, two.turn_rewards = torch.tensor([1, 1, 1]), [[3.0, 1.5, 2.0, 8.0], [], []]
    for turns in (one, two, None):  # a single-turn batch adds nothing
        callback.on_validation_batch_end(trainer, sink, {"rollout": _rollout(turns)}, None, 0)
    callback.on_validation_epoch_end(trainer, sink)
    torch.testing.assert_close(sink.logged["val/agent/turns_mean"], torch.tensor(9 / 6))
    torch.testing.assert_close(sink.logged["val/agent/context_token_frac"], torch.tensor(10 / 24))
    torch.testing.assert_close(sink.logged["val/agent/turn_reward_mean/0"], torch.tensor(6.0 / 4))
    torch.testing.assert_close(sink.logged["val/agent/turn_reward_mean/3"], torch.tensor(8.0))
    assert not any(name.startswith("train/") for name in sink.logged)
    sink.logged.clear()  # the sanity check logs nothing, and the sums start afresh each epoch
    callback.on_validation_batch_end(trainer, sink, {"rollout": _rollout(one)}, None, 0)
    callback.on_validation_epoch_end(SimpleNamespace(sanity_checking=True), sink)
    assert sink.logged == {} and callback._val is None
