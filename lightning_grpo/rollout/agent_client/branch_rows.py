"""An agent rollout's rows are the branches of its trajectories: building that rollout from the recorders
(:func:`branch_rollout`), and reading it back by trajectory (rewards from each one's last branch, advantages shared
by all its branches).

Re-exported by :mod:`~lightning_grpo.rollout.agent_client`; see ``docs/agents.md``, "Your own agent code".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.agent_client.agent_types import AgentExecution, AgentStats, NoAgentCallError
from lightning_grpo.rollout.batch import Rollout

__all__ = [
    "AGENT_COLUMNS",
    "branch_rollout",
    "is_agent_rollout",
    "per_trajectory",
    "spread_to_branches",
    "trajectory_rewards_nan",
]

#: Columns an agent rollout adds to each row: the trajectory's returned reward, its number in the batch, whether the
#: row is the trajectory's last branch (the one rewards are read from), and the agent's error (``None`` if it ran).
AGENT_COLUMNS = ("agent_reward", "agent_trajectory", "agent_last", "agent_error")


def branch_rollout(
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    executions: list[AgentExecution],
    stats: AgentStats,
) -> Rollout:
    """One row per branch of every trajectory, in trajectory order; group ids are the batch rows.

    The rows' ``kept_margins`` are the branches' margins (0 on context and padding), ``None`` when a branch has none
    (the sampling truncated nothing).

    Raises:
        NoAgentCallError: No trajectory has a branch (no agent made a chat call).
        ValueError: A dataset column is named like one of :data:`AGENT_COLUMNS`.
    """
    entries = [
        (t, e, branch, i == len(e.recorder.branches) - 1)
        for t, e in enumerate(executions)
        for i, branch in enumerate(e.recorder.branches)
    ]
    if not entries:
        first = f"; the first error: {stats.failures[0][1]!r}" if stats.failures else ""
        raise NoAgentCallError(f"no agent execution made a chat call, so there is nothing to train on{first}", stats)
    branches = [b for _, _, b, _ in entries]
    p = max(len(b.prompt_ids) for b in branches)
    t = max(1, *(len(b.tokens) for b in branches))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (p - len(b.prompt_ids)) + b.prompt_ids for b in branches], dtype=torch.long)
    prompt_mask = (torch.arange(p) >= p - torch.tensor([len(b.prompt_ids) for b in branches])[:, None]).long()
    mask = (torch.arange(t) < torch.tensor([len(b.tokens) for b in branches])[:, None]).long()
    ids = _right_pad([b.tokens for b in branches], pad, t, torch.long)
    sampled = _right_pad([b.sampled for b in branches], 0, t, torch.long)
    logprobs = _right_pad([b.logprobs for b in branches], 0.0, t, torch.float32)
    with_margins = all(b.margins is not None for b in branches)
    margins = _right_pad([b.margins for b in branches], 0.0, t, torch.float32) if with_margins else None
    columns = {key: [rows[e.row][key] for _, e, _, _ in entries] for key in rows[0] if key != "prompt"}
    clash = sorted(set(columns) & set(AGENT_COLUMNS))
    if clash:
        raise ValueError(f"dataset column(s) {clash} clash with the agent rollout's columns; rename them")
    columns.update(
        agent_reward=[e.reward for _, e, _, _ in entries],
        agent_trajectory=[t for t, _, _, _ in entries],
        agent_last=[last for _, _, _, last in entries],
        agent_error=[None if e.error is None else repr(e.error) for _, e, _, _ in entries],
    )
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=ids,
        completion_mask=mask,
        truncated=torch.tensor([not b.open for _, _, b, _ in entries]),
        group_ids=torch.tensor([e.row for _, e, _, _ in entries]),
        prompts=[b.prompt for _, _, b, _ in entries],
        completions=[b.messages[len(b.prompt) :] for _, _, b, _ in entries],
        columns=columns,
        sampled_mask=sampled,
        logprobs=logprobs,
        kept_margins=margins,
    )


def _right_pad(rows: list[list[Any]], value: Any, width: int, dtype: torch.dtype) -> torch.Tensor:
    """``(len(rows), width)`` rows padded on the right with ``value`` (one tensor built, not one per row)."""
    return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype)


def trajectory_rewards_nan(rewards: torch.Tensor, rollout: Rollout) -> torch.Tensor:
    """``rewards`` with every row but each trajectory's last branch set to NaN (left out of group statistics)."""
    last = torch.tensor(rollout.columns["agent_last"], dtype=torch.bool, device=rewards.device)
    return torch.where(last, rewards, torch.full_like(rewards, math.nan))


def spread_to_branches(advantages: torch.Tensor, rollout: Rollout) -> torch.Tensor:
    """Each row's advantage taken from its trajectory's last branch (all branches of a trajectory share it)."""
    if advantages.dim() != 1:
        raise ValueError(
            "agent= needs an advantage estimator with one advantage per sequence; token-level advantages "
            f"{tuple(advantages.shape)} cannot be shared by branches of other lengths"
        )
    trajectory, last = rollout.columns["agent_trajectory"], rollout.columns["agent_last"]
    source = {t: i for i, (t, is_last) in enumerate(zip(trajectory, last, strict=True)) if is_last}
    index = torch.tensor([source[t] for t in trajectory], dtype=torch.long, device=advantages.device)
    return advantages[index]


def per_trajectory(rewards: torch.Tensor, rollout: Rollout, trajectories: int) -> torch.Tensor:
    """``(trajectories,)`` rewards, one per agent execution in batch order (its last branch's; NaN for one without a
    row)."""
    out = torch.full((trajectories,), math.nan, dtype=rewards.dtype, device=rewards.device)
    last = torch.tensor(rollout.columns["agent_last"], dtype=torch.bool, device=rewards.device)
    index = torch.tensor(rollout.columns["agent_trajectory"], dtype=torch.long, device=rewards.device)
    out[index[last]] = rewards[last]
    return out


def is_agent_rollout(rollout: Rollout) -> bool:
    """Whether the rollout was built by :func:`~lightning_grpo.rollout.agent_client.rollout.run_agents` (its rows are
    branches)."""
    return "agent_last" in rollout.columns
