"""Process supervision in the GRPO iteration: gather step rewards for a process estimator and check, at fit start,
that some exist.

Process supervision has one file per layer, each named ``process_supervision.py`` (the same feature in four
layers): ``algorithms`` (the advantages), ``rewards`` (:class:`~lightning_grpo.rewards.StepRewards`, the process reward
model), ``rollout`` (step ends as token positions) and ``iteration`` (gathering the step rewards of one GRPO iteration).


Step rewards come from reward functions that return :class:`~lightning_grpo.rewards.StepRewards` (weighted by their
reward weights) and from environment turn rewards (weight 1); :func:`~lightning_grpo.rollout.process_supervision.
step_rewards_tensor` places them on tokens. See ``docs/math.md`` ("Process supervision").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_grpo.algorithms.advantages import estimator_needs
from lightning_grpo.algorithms.process_supervision import with_outcome_step
from lightning_grpo.config import GRPOConfig
from lightning_grpo.rewards import RewardFunctions, RewardScores
from lightning_grpo.rewards.process_supervision import gives_step_rewards
from lightning_grpo.rollout import Rollout
from lightning_grpo.rollout.process_supervision import step_rewards_tensor

__all__ = ["advantage_inputs", "check_step_sources", "gather_step_rewards", "outcome_rewards"]


def gather_step_rewards(
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    rollout: Rollout,
    scores: RewardScores,
    rewards: RewardFunctions,
) -> Tensor | None:
    """``(N, T)`` step rewards (NaN where no step ends) for an estimator that declares it needs them; else ``None``.

    With ``config.advantages.process_outcome_weight`` set, the outcome reward (the weighted sum of the functions that
    returned a number for the row, not :class:`~lightning_grpo.rewards.StepRewards`) times that weight is one more step,
    ending at the row's last sampled token.
    """
    if not estimator_needs(config.advantages.advantage_estimator).step_rewards:
        return None
    weights = dict(zip(rewards.names, rewards.weights, strict=True))
    steps = step_rewards_tensor(tokenizer, rollout, scores.steps, weights)  # (N, T)
    outcome = outcome_rewards(scores, weights).to(steps.device)
    last_tokens = rollout.sampled_mask * rollout.completion_mask
    return with_outcome_step(steps, outcome, last_tokens, config.advantages.process_outcome_weight)


def outcome_rewards(scores: RewardScores, weights: dict[str, float]) -> Tensor:
    """``(N,)`` the weighted sum of the numbers reward functions returned (step rewards left out); NaN if none."""
    total = torch.zeros_like(scores.rewards)
    applied = torch.zeros_like(scores.rewards, dtype=torch.bool)
    for name, values in scores.per_function.items():
        has_steps = [row is not None for row in scores.steps.get(name, [None] * len(values))]
        number = ~torch.isnan(values) & ~torch.tensor(has_steps, dtype=torch.bool, device=values.device)
        total = total + torch.where(number, weights[name] * values, 0.0)
        applied = applied | number
    return torch.where(applied, total, torch.nan)


def advantage_inputs(scores: RewardScores) -> dict[str, Any]:
    """Keywords for ``GRPOModule.compute_advantages`` beyond ``(rewards, rollout)``: ``step_rewards`` when scored.

    Only for an estimator that needs step rewards does the step pass ``step_rewards``, so an override of
    ``compute_advantages(rewards, rollout)`` keeps working with every outcome estimator.
    """
    return {} if scores.step_rewards is None else {"step_rewards": scores.step_rewards}


def check_step_sources(config: GRPOConfig, rewards: RewardFunctions, *, environment: bool) -> None:
    """At fit start: refuse an estimator that needs step rewards (``grpo_process``, or a user's that declares
    ``needs_step_rewards``) when neither an environment nor a marked reward function gives them.

    Raises:
        ValueError: Naming the reward functions and the two ways to give step rewards.
    """
    if not estimator_needs(config.advantages.advantage_estimator).step_rewards or environment:
        return
    if any(gives_step_rewards(function) for function in rewards.functions):
        return
    raise ValueError(
        f"advantage_estimator={config.advantages.advantage_estimator!r} needs step rewards, but no environment is set "
        "and none "
        f"of the reward functions {list(rewards.names)} is marked as giving them. Give an environment_factory (its "
        "turn rewards are the steps), or a reward function that returns StepRewards per completion, marked with "
        "@lightning_grpo.rewards.step_reward (docs/math.md, Process supervision); or use advantage_estimator='grpo'"
    )
