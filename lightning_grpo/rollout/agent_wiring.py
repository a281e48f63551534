"""How ``GRPOModule``'s agent arguments become its rollouts: ``tools``, ``environment_factory`` and ``tool_parser``
drive the turn loop (:func:`~lightning_grpo.rollout.sampling.sample_rollout`); ``agent=`` runs the user's agent code
instead (:func:`~lightning_grpo.rollout.agent_client.run_agents`).

The module asks three things of this layer: the agent code and the reward functions its arguments imply
(:func:`agent_code`, :func:`agent_rewards`, at construction), and one batch's rollout (:func:`sample_batch`, each
``generate``). Under several processes the ranks agree on each rollout before their next collective
(:func:`~lightning_grpo.rollout.rank_agreement.agreed_rollout`): a failure on one rank is an error naming it on every
rank, and a rank whose agents made no chat call takes part with an empty rollout. See ``docs/agents.md`` and
``docs/distributed.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents import EnvironmentFactory
from lightning_grpo.agents.trl_environment import with_environment_rewards
from lightning_grpo.rewards import RewardFunctions
from lightning_grpo.rollout import agent_client
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.batch import Rollout
from lightning_grpo.rollout.rank_agreement import InStepSession, RankVotes, agreed_rollout
from lightning_grpo.rollout.sampling import sample_rollout
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.rollout.session import RolloutSession

__all__ = [
    "agent_code",
    "agent_rewards",
    "check_agent_strategy",
    "empty_agent_rollout",
    "sample_batch",
    "trajectory_rewards",
]

#: What ``reward_funcs=`` may be (a sequence, a mapping of names, or a ``RewardFunctions``).
RewardFuncs = Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]] | RewardFunctions


def agent_code(
    agent: Callable[..., Any] | str | None, tools: Any, environment_factory: Any, *, dynamic_sampling: bool
) -> Callable[..., Any] | None:
    """``agent=`` checked (an import path imported); ``None`` without one.

    Raises:
        TypeError: It is not a coroutine function.
        ValueError: ``tools`` or ``environment_factory`` are given too, or ``dynamic_sampling`` is on.
    """
    code = agent_client.module_agent(agent, tools, environment_factory)
    if code is not None and dynamic_sampling:
        raise ValueError("agent= cannot be combined with dynamic_sampling=True yet (rounds of branch rows)")
    return code


def agent_rewards(
    code: Callable[..., Any] | None,
    environment_factory: EnvironmentFactory | Mapping[str, Callable[[], Any]] | None,
    reward_funcs: RewardFuncs | None,
    reward_weights: Sequence[float] | None,
    *,
    timeout: Any,
) -> tuple[Any, RewardFunctions]:
    """The environment factory left for the turn loop and the run's reward functions.

    Agent code without ``reward_funcs`` (``None`` or empty) is rewarded with what each run returned; a TRL-style
    environment with ``get_reward()`` adds its reward (:func:`~lightning_grpo.agents.trl_environment.
    with_environment_rewards`).
    """
    if code is not None and not reward_funcs:  # [] or {}: nothing given, as with environment_factory
        reward_funcs = [agent_client.agent_reward]  # the reward each agent returned
    factory, funcs, weights = with_environment_rewards(environment_factory, reward_funcs, reward_weights)
    return factory, RewardFunctions.of(funcs, weights, timeout=timeout)


def check_agent_strategy(code: Callable[..., Any] | None, *, fsdp2: bool) -> None:
    """Refuse agent code under FSDP2, whose ranks must join every sampling call together.

    Raises:
        ValueError: Agent code under FSDP2.
    """
    if code is not None and fsdp2:
        raise ValueError(
            "agent= under FSDP2: every rank must join every sampling call, but each rank's agents decide how many "
            "calls they make; train agents under DDP (strategy='ddp': each rank runs its own rows and server)"
        )


def sample_batch(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    batch: Mapping[str, Sequence[Any]],
    settings: SamplingSettings,
    agent: AgentSettings,
    code: Callable[..., Any] | None,
    *,
    session: RolloutSession,
    max_prompt_length: int,
    limits: agent_client.AgentLimits,
    rank: int = 0,
    ranks: RankVotes | None = None,
) -> tuple[Rollout, agent_client.AgentStats | None]:
    """One batch's rollout: the agent code G times per row, or G completions per prompt by the turn loop.

    Every route passes here, so this is where the ranks agree on the rollout (:func:`agreed_rollout`).

    Args:
        policy: The policy model.
        tokenizer: Its tokenizer.
        batch: Columns of the batch: ``"prompt"`` and the other row fields.
        settings: Sampling settings.
        agent: Tools, parser, environment and ``max_turns`` of the turn loop (the parser reads agent code's calls too).
        code: The agent code of ``agent=``, or ``None``: the turn loop.
        session: The backend's sampling session.
        max_prompt_length: Longest prompt in tokens.
        limits: Agent code's limits; with a fixed port, rank ``r`` listens on ``port + r``.
        rank: This process's rank.
        ranks: The ranks' votes on several processes (under FSDP2 the turn loop asks them whether any rank still
            samples); ``None`` on one process.

    Returns:
        The rollout, and what the agents did (``None`` for the turn loop).

    Raises:
        KeyError: The batch has no ``"prompt"`` (and no TRL-style environment fills it); on one process.
        RankFailureError: On several processes, the rollout of some rank raised (the error names each such rank
            and its cause), or every rank's agents made no chat call.
    """

    def sample() -> tuple[Rollout, agent_client.AgentStats | None]:
        if code is not None:
            return _agent_rollout(
                policy,
                tokenizer,
                batch,
                settings,
                agent,
                code,
                session=session,
                rank=rank,
                max_prompt_length=max_prompt_length,
                limits=limits,
                ranks=ranks,
            )
        prompts = agent.prompts_of(batch)  # KeyError without "prompt" (unless TRL-style environments fill it)
        columns = {key: list(values) for key, values in batch.items() if key != "prompt"}
        in_step = ranks is not None and settings.synced_gpus  # every rank joins every sampling call (FSDP2)
        active = ranks.any_active if in_step else None
        rollout = sample_rollout(
            policy,
            tokenizer,
            prompts,
            settings,
            agent,
            max_prompt_length=max_prompt_length,
            columns=columns,
            any_rank_active=active,
            sample=InStepSession(session) if in_step else session,
        )
        return rollout, None

    return agreed_rollout(sample, ranks, is_empty=lambda result: len(result[0]) == 0)


def _agent_rollout(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    batch: Mapping[str, Sequence[Any]],
    settings: SamplingSettings,
    agent: AgentSettings,
    code: Callable[..., Any],
    *,
    session: RolloutSession,
    max_prompt_length: int,
    limits: agent_client.AgentLimits,
    rank: int,
    ranks: RankVotes | None,
) -> tuple[Rollout, agent_client.AgentStats]:
    """The agent code's rollout; on several processes, agents that made no chat call and raised nothing give an
    empty rollout (the rank takes part in the iteration without rows) instead of an error."""
    rows = [{key: values[i] for key, values in batch.items()} for i in range(len(next(iter(batch.values()))))]
    limits = replace(limits, port=limits.port + rank if limits.port else 0)  # each rank its own server
    try:
        return agent_client.run_agents(
            policy,
            tokenizer,
            code,
            rows,
            settings,
            agent.parser,
            max_prompt_length=max_prompt_length,
            limits=limits,
            sample=session,
        )
    except agent_client.NoAgentCallError as error:
        if ranks is None or error.stats.failures:  # one process has nothing to train on; a failure is a cause
            raise
        device = next(policy.parameters()).device
        return empty_agent_rollout(rows, device, truncates=settings.truncates), error.stats


def empty_agent_rollout(
    rows: Sequence[Mapping[str, Any]], device: torch.device | str = "cpu", *, truncates: bool = False
) -> Rollout:
    """An agent rollout without rows (tensors of width 1, on ``device``), with the columns of ``rows`` and the agent
    columns; ``kept_margins`` too (no row) when the sampling ``truncates``, as the other ranks' rollouts have them."""
    none = torch.zeros((0, 1), dtype=torch.long, device=device)
    columns: dict[str, list[Any]] = {key: [] for key in (rows[0] if rows else {}) if key != "prompt"}
    columns.update({key: [] for key in agent_client.AGENT_COLUMNS})
    return Rollout(
        prompt_ids=none,
        prompt_mask=none.clone(),
        completion_ids=none.clone(),
        completion_mask=none.clone(),
        truncated=torch.zeros(0, dtype=torch.bool, device=device),
        prompts=[],
        completions=[],
        columns=columns,
        group_ids=torch.zeros(0, dtype=torch.long, device=device),
        sampled_mask=none.clone(),
        logprobs=torch.zeros((0, 1), device=device),
        kept_margins=torch.zeros((0, 1), device=device) if truncates else None,
    )


def trajectory_rewards(rewards: Tensor, rollout: Rollout, *, trajectories: int) -> Tensor:
    """One reward per trajectory, in batch order: an agent rollout's from each trajectory's last branch
    (``trajectories`` of them), any other rollout's own (one row per completion)."""
    if agent_client.is_agent_rollout(rollout):
        return agent_client.per_trajectory(rewards, rollout, trajectories)
    return rewards
