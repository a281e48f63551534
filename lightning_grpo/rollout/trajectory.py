"""One running trajectory of the turn loop (:class:`Trajectory`) and what one sampling call gives each
(:class:`SampledTurn`); the loop itself is :mod:`~lightning_grpo.rollout.multi_turn`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lightning_grpo.agents import EnvironmentEpisode, ToolSet
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.sampling_settings import Sampled

__all__ = ["SampledTurn", "Trajectory", "sampled_turns"]


class SampledTurn(NamedTuple):
    """One row of a sampling call: its new tokens (up to the call's budget) and, per token, what the sampler recorded.

    Attributes:
        tokens: The tokens sampled after the row's context (padding after its end included).
        logprobs: Their behaviour log-probs (:attr:`Sampled.logprobs
            <lightning_grpo.rollout.sampling_settings.Sampled.logprobs>`).
        margins: Their kept-set margins (:attr:`Sampled.margins
            <lightning_grpo.rollout.sampling_settings.Sampled.margins>`); ``None`` when the sampling truncates nothing.
    """

    tokens: list[int]
    logprobs: list[float]
    margins: list[float] | None = None


def sampled_turns(out: Sampled, prompt_width: int) -> list[SampledTurn]:
    """Each row of ``out`` as a :class:`SampledTurn`: what follows the ``prompt_width`` context tokens."""
    margins = out.margins.tolist() if out.margins is not None else [None] * len(out.sequences)
    rows = zip(out.sequences[:, prompt_width:].tolist(), out.logprobs.tolist(), margins, strict=True)
    return [SampledTurn(*row) for row in rows]


@dataclass
class Trajectory:
    """One sample's conversation while it runs (the mutable state of the turn loop).

    ``tokens``, ``sampled``, ``logprobs`` and ``margins`` are aligned, one entry per token after the prompt: tokens
    the policy sampled (``sampled`` 1, with the log-prob and kept-set margin the sampler recorded) and tokens inserted
    as context (0, log-prob and margin 0). ``margins_recorded`` is ``False`` once a sampled turn came without margins
    (a sampler that truncates nothing, or records none): its 0s are no kept set.
    """

    prompt: list[dict[str, Any]]
    episode: EnvironmentEpisode | None = None
    environment: Any = None  # a TRL-style environment instance
    tools: ToolSet | None = None  # the tools of this trajectory (a TRL-style environment's); None: the run's
    messages: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)  # 0.0 where the sampler recorded none
    margins_recorded: bool = True
    reward_ends: list[int] = field(default_factory=list)  # per environment step: the last token of the judged turn
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    done: bool = False
    truncated: bool = False
    max_turns_reached: bool = False

    def extend(
        self,
        ids: Sequence[int],
        *,
        sampled: bool,
        logprobs: Sequence[float] | None = None,
        margins: Sequence[float] | None = None,
    ) -> None:
        """Append tokens, marked as sampled by the policy (with their log-probs and kept-set margins) or inserted as
        context (log-prob and margin 0)."""
        self.tokens.extend(ids)
        self.sampled.extend([int(sampled)] * len(ids))
        self.logprobs.extend(logprobs[: len(ids)] if logprobs is not None else [0.0] * len(ids))
        self.margins.extend(margins[: len(ids)] if margins is not None else [0.0] * len(ids))
        self.margins_recorded = self.margins_recorded and (margins is not None or not sampled)

    def tool_schemas(self, agent: AgentSettings) -> list[dict[str, Any]] | None:
        """The tool schemas rendered in this trajectory's prompt: its environment's tools, else the run's."""
        if self.tools is not None:
            return self.tools.schemas or None
        return agent.tool_schemas

    def stop(self, *, truncated: bool = False, max_turns: bool = False) -> None:
        """End the trajectory, flagged truncated (and cut by ``max_turns``) when asked."""
        self.done, self.truncated, self.max_turns_reached = True, truncated, max_turns
