"""The values one agent rollout passes around: its limits (:class:`AgentLimits`), each trajectory's execution
(:class:`AgentExecution`), what the agents did (:class:`AgentStats`), and the error of a rollout without a row
(:class:`NoAgentCallError`).

Re-exported by :mod:`~lightning_grpo.rollout.agent_client`;
:func:`~lightning_grpo.rollout.agent_client.rollout.run_agents` takes the limits and returns the stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning_grpo.rollout.agent_client.recorder import TrajectoryRecorder

__all__ = ["AgentExecution", "AgentLimits", "AgentStats", "NoAgentCallError"]


@dataclass(frozen=True)
class AgentLimits:
    """Time limits and batching of agent executions (``GRPOConfig.agents.agent_call_timeout``, ``agent_timeout``,
    ``agent_batch_window``), the model name served, and the route: ``transport`` ``"in_process"`` (a
    ``PolicyClient``) or ``"http"`` (a loopback server on ``port``, 0 for a free one;
    ``GRPOConfig.agents.agent_transport``, ``agent_http_port``)."""

    call_timeout: float = 60.0
    timeout: float = 600.0
    window: float = 0.01
    model: str = "policy"
    transport: str = "in_process"
    port: int = 0

    @classmethod
    def of(cls, config: Any) -> AgentLimits:
        """The limits a ``GRPOConfig`` sets (its ``agent_*`` settings)."""
        return cls(
            config.agents.agent_call_timeout,
            config.agents.agent_timeout,
            config.agents.agent_batch_window,
            transport=config.agents.agent_transport,
            port=config.agents.agent_http_port,
        )


class NoAgentCallError(RuntimeError):
    """No agent execution of the batch made a chat call, so the rollout has no row; ``stats`` says what the agents
    did."""

    def __init__(self, message: str, stats: AgentStats) -> None:
        super().__init__(message)
        self.stats = stats


@dataclass
class AgentExecution:
    """One trajectory: its row, recorder, returned reward and error."""

    row: int
    recorder: TrajectoryRecorder
    reward: float | None = None
    error: BaseException | None = None
    calls: int = 0


@dataclass
class AgentStats:
    """What a rollout's agents did: failed executions, batch sizes of the sampling calls."""

    failures: list[tuple[int, BaseException]] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    executions: int = 0  # agent executions (trajectories): rows × G

    def metrics(self, sequences: int) -> dict[str, float]:
        """``rollout/agent_failed`` (executions that raised) and ``rollout/agent_sequences_per_trajectory`` (rollout
        rows per execution, ``sequences`` of them: an execution whose calls branch adds rows)."""
        return {
            "rollout/agent_failed": float(len(self.failures)),
            "rollout/agent_sequences_per_trajectory": sequences / max(self.executions, 1),
        }
