"""Reward functions: the protocol, weighted combination, and built-ins.

A reward function is any callable ``fn(prompts=..., completions=..., completion_ids=..., **columns) ->
list[float | None]``, sync or ``async``, called by keyword; see :mod:`lightning_grpo.rewards.reward_functions`. A
trained sequence-classification model is one too: :class:`RewardModel`. Built-ins: :func:`math_answer` (final answer
against a reference), :data:`format_reward` / :class:`FormatReward` (a pattern such as
``<think>...</think><answer>...</answer>``) and :class:`OverlongPenalty` (DAPO's soft overlong punishment). For
process supervision a function returns :class:`StepRewards` per completion (marked with :func:`step_reward`);
:class:`ProcessRewardModel` is one.
"""

from __future__ import annotations

from lightning_grpo.rewards._text import completion_text
from lightning_grpo.rewards.format import DEFAULT_PATTERN, FormatReward, format_reward
from lightning_grpo.rewards.math_answer import answers_match, extract_answer, math_answer
from lightning_grpo.rewards.overlong import OverlongPenalty, soft_overlong_penalty
from lightning_grpo.rewards.process_supervision import ProcessRewardModel, StepRewards, gives_step_rewards, step_reward
from lightning_grpo.rewards.reward_functions import (
    RewardError,
    RewardFunction,
    RewardFunctions,
    RewardInputError,
    RewardOutputError,
    RewardScores,
    TrainerState,
)
from lightning_grpo.rewards.reward_model import RewardModel

__all__ = [
    "DEFAULT_PATTERN",
    "FormatReward",
    "OverlongPenalty",
    "ProcessRewardModel",
    "RewardError",
    "RewardFunction",
    "RewardFunctions",
    "RewardInputError",
    "RewardModel",
    "RewardOutputError",
    "RewardScores",
    "StepRewards",
    "TrainerState",
    "answers_match",
    "completion_text",
    "extract_answer",
    "format_reward",
    "gives_step_rewards",
    "math_answer",
    "soft_overlong_penalty",
    "step_reward",
]
