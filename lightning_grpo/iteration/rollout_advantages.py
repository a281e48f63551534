"""Phase 3 of a GRPO iteration, ``GRPOModule.compute_advantages``: the advantages of a rollout's rows.

:func:`rollout_advantages` runs the configured estimator (:func:`~lightning_grpo.algorithms.compute_advantages`)
over the rollout's groups, with sums across ranks for batch-level statistics. A rollout of agent code (``agent=``)
has one row per branch of a trajectory: its reward is the trajectory's, held by the last branch, so only last
branches enter the group statistics and every branch gets its trajectory's advantage.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.algorithms.statistics import SumAcrossRanks
from lightning_grpo.config import GRPOConfig
from lightning_grpo.rollout import Rollout, agent_client

__all__ = ["rollout_advantages"]


def rollout_advantages(
    rewards: Tensor,
    rollout: Rollout,
    config: GRPOConfig,
    sum_across_ranks: SumAcrossRanks,
    step_rewards: Tensor | None = None,
    function_rewards: Mapping[str, Tensor] | None = None,
    function_weights: Mapping[str, float] | None = None,
) -> Tensor:
    """Group-relative advantages ``(N,)`` of ``rollout``'s rows (``(N, T)`` for token-level estimators).

    Args:
        rewards: ``(N,)`` rewards (``NaN`` where no reward function applied).
        rollout: The rollout scored.
        config: The module's settings (``config.advantages``).
        sum_across_ranks: Sums a tensor over the ranks (batch-level statistics).
        step_rewards: ``(N, T)`` step rewards, for an estimator that needs them (``grpo_process``).
        function_rewards: Each reward function's raw rewards, for an estimator that reads them (``gdpo``).
        function_weights: Each reward function's weight, with ``function_rewards``.
    """
    agents = agent_client.is_agent_rollout(rollout)  # one reward per trajectory (its last branch), shared
    rewards = agent_client.trajectory_rewards_nan(rewards, rollout) if agents else rewards
    advantages = compute_advantages(
        rewards,
        rollout.group_ids,
        **config.advantages.kwargs,
        completion_mask=rollout.sampled_mask,
        sum_across_ranks=sum_across_ranks,
        step_rewards=step_rewards,
        function_rewards=function_rewards,
        function_weights=function_weights,  # token-level estimators whiten over rollout.sampled_mask
    )
    return agent_client.spread_to_branches(advantages, rollout) if agents else advantages
