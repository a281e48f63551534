"""Per-reward-function advantages (``gdpo``) in the GRPO iteration: what the estimator is given, and the checks at
construction that it can work (two reward functions or more; with ``agent=``, reward functions besides the agent's
own reward).

An estimator that declares ``needs_function_rewards`` (:func:`~lightning_grpo.algorithms.declare_needs`) receives
each reward function's raw rewards (``RewardScores.per_function``) and weights besides their weighted sum.
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.algorithms.advantages import estimator_needs
from lightning_grpo.config import GRPOConfig
from lightning_grpo.rewards import RewardFunctions, RewardScores

__all__ = ["check_function_rewards", "function_reward_inputs"]


def needs_function_rewards(config: GRPOConfig) -> bool:
    """Whether ``config.advantages.advantage_estimator`` reads each reward function's rewards."""
    return estimator_needs(config.advantages.advantage_estimator).function_rewards


def check_function_rewards(config: GRPOConfig, rewards: RewardFunctions, *, agent: bool) -> None:
    """At construction: refuse a per-function estimator with fewer than two reward functions (``agent=`` without
    ``reward_funcs`` has one: the agent's return).

    Raises:
        ValueError: Naming ``advantage_estimator``, the reward functions and the fix.
    """
    if not needs_function_rewards(config):
        return
    name = config.advantages.advantage_estimator
    if agent and len(rewards.names) < 2:
        raise ValueError(
            f"advantage_estimator={name!r} normalises each reward function within its group, but this agent= run "
            f"has one reward ({list(rewards.names)}; without reward_funcs it is the number each agent execution "
            "returns); score the trajectories with two reward functions or more (reward_funcs=...), or use "
            "advantage_estimator='grpo'"
        )
    if len(rewards.names) < 2:
        raise ValueError(
            f"advantage_estimator={name!r} normalises each reward function within its group and needs two reward "
            f"functions or more; got {list(rewards.names)}. Add a reward function (reward_funcs), or use "
            "advantage_estimator='grpo' with advantage_scale='batch' (the same thing for one function)"
        )


def function_reward_inputs(config: GRPOConfig, scores: RewardScores, rewards: RewardFunctions) -> dict[str, Any]:
    """Keywords for ``GRPOModule.compute_advantages``: ``function_rewards`` (name to ``(N,)`` raw rewards, NaN for
    ``None``) and ``function_weights`` when the estimator reads them; else none (an override of
    ``compute_advantages(rewards, rollout)`` keeps working with every other estimator)."""
    if not needs_function_rewards(config):
        return {}
    weights = dict(zip(rewards.names, rewards.weights, strict=True))
    return {"function_rewards": dict(scores.per_function), "function_weights": weights}
