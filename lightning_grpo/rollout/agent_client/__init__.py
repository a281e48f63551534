"""Train the agent code users already have: an in-process ``openai.AsyncOpenAI`` on the policy, token-exact.

``GRPOModule(..., agent=my_agent)`` runs ``async def my_agent(client, row) -> float | None`` G times per row; see
``docs/agents.md``, "Your own agent code". ``GRPOConfig.agents.agent_transport="http"`` serves the same calls on a
loopback HTTP server instead (:mod:`~lightning_grpo.rollout.agent_client.server`, the ``http`` extra), for agents in
other processes. The ``openai`` package (the ``openai`` extra) is imported only by
:mod:`~lightning_grpo.rollout.agent_client.client`, when agents run.
"""

from lightning_grpo.rollout.agent_client.agent_types import AgentLimits, AgentStats, NoAgentCallError
from lightning_grpo.rollout.agent_client.branch_rows import (
    AGENT_COLUMNS,
    is_agent_rollout,
    per_trajectory,
    spread_to_branches,
    trajectory_rewards_nan,
)
from lightning_grpo.rollout.agent_client.env import agent_env
from lightning_grpo.rollout.agent_client.openai_messages import message_key, normalize_messages, same_messages
from lightning_grpo.rollout.agent_client.recorder import Branch, CallPlan, TrajectoryRecorder
from lightning_grpo.rollout.agent_client.rollout import agent_reward, check_agent, module_agent, run_agents

__all__ = [
    "AGENT_COLUMNS",
    "AgentLimits",
    "AgentStats",
    "Branch",
    "CallPlan",
    "NoAgentCallError",
    "TrajectoryRecorder",
    "agent_env",
    "agent_reward",
    "check_agent",
    "is_agent_rollout",
    "message_key",
    "module_agent",
    "normalize_messages",
    "per_trajectory",
    "run_agents",
    "same_messages",
    "spread_to_branches",
    "trajectory_rewards_nan",
]
