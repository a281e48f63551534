"""Phase 1's body: a batch's rollout sampled through the run's backend (``GRPOModule.generate`` calls it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends import RolloutBackend
from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.nonfinite import nonfinite_sampling
from lightning_grpo.rollout import Rollout, agent_client, agent_wiring
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.rank_agreement import RankVotes
from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = ["sample_with_backend"]

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
