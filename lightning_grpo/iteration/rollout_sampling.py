"""Phase 1's body: a batch's rollout sampled through the run's backend (``GRPOModule.generate`` calls it), and the
sampling readied before it (:func:`start_sampling`: at fit start, and at the start of a validate, test or predict of
its own)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo import distributed
from lightning_grpo.backends import RolloutBackend
from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.nonfinite import nonfinite_sampling
from lightning_grpo.rewards import RewardFunctions
from lightning_grpo.rollout import Rollout, agent_client, agent_wiring
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.rank_agreement import RankVotes
from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = ["sample_with_backend", "start_sampling"]

Agents = tuple[AgentSettings, Callable[..., Any] | None, agent_client.AgentLimits]
Where = tuple[int, int, RankVotes | None]


def sample_with_backend(
    backend: RolloutBackend,
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    batch: Mapping[str, Sequence[Any]],
    settings: SamplingSettings,
    agents: Agents,
    where: Where,
    config: GRPOConfig,
) -> tuple[Rollout, agent_client.AgentStats | None]:
    """The policy's weights synced to ``backend`` (a no-op once synced), then one session's rollout of ``batch``.

    Args:
        backend: The run's rollout backend.
        policy: The policy model.
        tokenizer: Its tokenizer.
        batch: Columns of the batch: ``"prompt"`` and the other row fields.
        settings: Sampling settings.
        agents: The turn loop's settings (tools, parser, environment), the agent code of ``agent=`` (or ``None``)
            and its limits.
        where: The global step (the adapter version sampled; 0 without a trainer), this process's rank and the
            ranks' votes (``None`` on one process): the ranks agree on the rollout before their next collective.
        config: The run's settings (``sampling.max_prompt_length``).

    Returns:
        The rollout and, for agent code, its executions' statistics (``None`` otherwise).
    """
    agent, code, limits = agents
    step, rank, ranks = where
    backend.sync(policy, step)
    with nonfinite_sampling(step), closing(backend.session(policy, settings)) as session:
        return agent_wiring.sample_batch(
            policy,
            tokenizer,
            batch,
            settings,
            agent,
            code,
            session=session,
            max_prompt_length=config.sampling.max_prompt_length,
            limits=limits,
            rank=rank,
            ranks=ranks,
        )


def start_sampling(
    backend: RolloutBackend,
    rewards: RewardFunctions,
    policy: nn.Module,
    *,
    device: torch.device,
    seed: int,
    version: int | None = None,
) -> None:
    """Ready the sampling: the reward models to ``device`` (they are not in the policy), ``backend`` started (a second
    start does nothing) and, given a ``version``, sent the policy's weights under it.

    Args:
        backend: The run's rollout backend; ``CloseRolloutBackend`` closes it at the end of the trainer's run.
        rewards: The reward functions (their reward models move to ``device``, in the policy's dtype).
        policy: The policy model.
        device: The module's device.
        seed: The module's seed (the backend's sampling seed).
        version: The global step whose weights to sync now; ``None`` (fit start): the first ``training_step`` syncs.
    """
    rewards.to(device, getattr(policy, "dtype", None))
    backend.start(policy, seed, sharded=distributed.is_sharded(policy))
    if version is not None:
        backend.sync(policy, version)
