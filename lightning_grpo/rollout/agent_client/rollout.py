"""A rollout driven by the user's own agent code: ``async def agent(client, row) -> reward``, run G times per
row.

Every execution (one trajectory) gets its own :class:`~lightning_grpo.rollout.agent_client.client.PolicyClient` and
recorder; all executions of
the batch go concurrently in one event loop, their calls gathered into batched sampling calls. The rollout's rows are
the branches of every trajectory (one or more each); see ``docs/agents.md``, "Your own agent code".
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents import ToolCallParser
from lightning_grpo.extras import require
from lightning_grpo.rollout.agent_client.gather import BatchSampler, CallGatherer, Request
from lightning_grpo.rollout.agent_client.grouping import PADDING, group_calls
from lightning_grpo.rollout.agent_client.handling import TrajectoryEndpoint
from lightning_grpo.rollout.agent_client.main_thread import MainThreadCalls
from lightning_grpo.rollout.agent_client.recorder import TrajectoryRecorder
from lightning_grpo.rollout.batch import Rollout, left_pad
from lightning_grpo.rollout.generation import eval_mode
from lightning_grpo.rollout.sampling_settings import SampleFn, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.rollout.session import RolloutSession, draw
from lightning_grpo.rollout.turn_cache import TurnCache

__all__ = [
    "AGENT_COLUMNS",
    "AgentExecution",
    "AgentLimits",
    "AgentStats",
    "NoAgentCallError",
    "agent_reward",
    "check_agent",
    "is_agent_rollout",
    "module_agent",
    "per_trajectory",
    "run_agents",
    "spread_to_branches",
    "trajectory_rewards_nan",
]

log = logging.getLogger(__name__)

#: Columns an agent rollout adds to each row: the trajectory's returned reward, its number in the batch, whether the
#: row is the trajectory's last branch (the one rewards are read from), and the agent's error (``None`` if it ran).
AGENT_COLUMNS = ("agent_reward", "agent_trajectory", "agent_last", "agent_error")


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


def check_agent(agent: Any) -> Callable[..., Any]:
    """``agent`` itself if it is an ``async def agent(client, row)``; an import path is imported first.

    Raises:
        TypeError: It is not a coroutine function.
    """
    if isinstance(agent, str):
        module, _, name = agent.rpartition(".")
        import importlib

        agent = getattr(importlib.import_module(module), name)
    target = agent.__call__ if not inspect.isfunction(agent) and callable(agent) else agent
    if not (inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(target)):
        raise TypeError(
            f"agent must be a coroutine function `async def agent(client, row) -> float | None`, got {agent!r}"
        )
    return agent


def module_agent(agent: Any, tools: Any, environment_factory: Any) -> Callable[..., Any] | None:
    """``GRPOModule``'s ``agent=``, checked; ``None`` without one.

    Raises:
        TypeError: It is not a coroutine function.
        ValueError: ``tools`` or ``environment_factory`` are given too (an agent runs its own tools).
        MissingExtraError: ``openai`` is not installed (the ``openai`` extra): said when the module is built.
    """
    if agent is None:
        return None
    require("openai", "GRPOModule(agent=...)")  # the agents' client; not first met in the first rollout
    if tools or environment_factory is not None:
        raise ValueError(
            "agent= runs your own agent code, which calls its own tools (pass their schemas as the chat call's "
            "tools=); it cannot be combined with tools= or environment_factory="
        )
    return check_agent(agent)


def agent_reward(prompts: list[Any], completions: list[Any], agent_reward: list[float | None], **_: Any) -> list[Any]:
    """The reward each agent returned (the default reward function of ``GRPOModule(agent=...)``)."""
    return list(agent_reward)


@torch.no_grad()
def run_agents(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    agent: Callable[..., Any],
    rows: Sequence[dict[str, Any]],
    settings: SamplingSettings,
    parser: ToolCallParser,
    *,
    max_prompt_length: int,
    limits: AgentLimits,
    sample: SampleFn | RolloutSession | None = None,
) -> tuple[Rollout, AgentStats]:
    """Run ``agent`` G times per row, concurrently; the rollout of their branches and what happened.

    Raises:
        NoAgentCallError: No trajectory recorded a single call (every agent failed before calling, or none called).
    """
    counter, prompts = itertools.count(), {}  # branch rows; rendered prompts, shared by the rollout's recorders
    g = settings.num_generations

    def recorder():
        return TrajectoryRecorder(
            tokenizer,
            settings.max_new_tokens,
            max_prompt_length,
            counter.__next__,
            prompts,
        )

    executions = [AgentExecution(b, recorder()) for b in range(len(rows)) for _ in range(g)]
    ends = _CacheEnds(sample)
    sampler = _batch_sampler(model, tokenizer, settings, sample, ends)
    calls = MainThreadCalls()  # the agents' loop in a worker thread; each batch sampled here (main_thread.py)
    with eval_mode(model):
        running = _run_all(agent, rows, executions, sampler, tokenizer, parser, limits, ends.ended, calls.call)
        stats = calls.run(running)
    ends.drop()  # the executions that returned after the last batch
    for index, error in stats.failures:
        row = executions[index].row
        log.warning("agent execution %d (batch row %d) failed: %s: %s", index, row, type(error).__name__, error)
    return _rollout(tokenizer, rows, executions, g, stats), stats


def _batch_sampler(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    settings: SamplingSettings,
    sample: SampleFn | RolloutSession | None,
    ends: _CacheEnds,
) -> BatchSampler:
    """Samples a gathered batch in one call of ``sample``, each context shared by calls that start a new branch
    prefilled once (:func:`~lightning_grpo.rollout.agent_client.grouping.group_calls`).

    A turn cache keeps a branch's cache while its agent is out of step (busy with a tool when a batch is sampled):
    it drops the caches of the executions that returned (``ends``) and of the padding rows."""
    eos = set(eos_token_ids(tokenizer).tolist())
    device = next(model.parameters()).device
    padding_rows = itertools.count(-1, -1)  # padding rows' trajectory numbers: never a branch's, never reused

    @torch.no_grad()
    def sample_batch(batch: list[Request]) -> list[Any]:
        ends.sampled(batch)
        ends.drop()  # in this thread, never while a batch is sampled
        groups = group_calls([r.context for r in batch], [r.shared for r in batch])
        ids, mask = left_pad([batch[i].context for i in groups.prompts], tokenizer.pad_token_id, device)
        rows = [batch[i].row if i != PADDING else next(padding_rows) for i in groups.members]
        call = replace(settings, num_generations=groups.g, max_new_tokens=max(r.max_tokens for r in batch))
        out = draw(sample, model, tokenizer, SampleRequest(ids, mask, call, rows=rows))
        ends.drop(row for row, i in zip(rows, groups.members, strict=True) if i == PADDING)
        results: list[Any] = [None] * len(batch)
        for i, new, logprobs in zip(
            groups.members, out.sequences[:, ids.shape[1] :].tolist(), out.logprobs.tolist(), strict=True
        ):
            if i != PADDING:
                cap = batch[i].max_tokens
                end = next((k + 1 for k, t in enumerate(new[:cap]) if t in eos), None)
                results[i] = (new[: end or cap], logprobs[: end or cap], end is not None)
        return results

    return sample_batch


class _CacheEnds:
    """Tells the turn cache of ``sample`` (a session's, such as the Hugging Face backend's; if it keeps one) when an
    agent's execution has ended, so that it keeps the caches of executions absent from a batch (busy with a tool)
    meanwhile.

    Executions are put in :attr:`ended` by the event loop's thread; :meth:`sampled` and :meth:`drop` run in the
    sampler's (never while a batch is sampled) or once the loop is over.
    """

    def __init__(self, sample: SampleFn | RolloutSession | None) -> None:
        cache = sample if isinstance(sample, TurnCache) else getattr(sample, "turn_cache", None)
        self.cache = cache if isinstance(cache, TurnCache) else None
        if self.cache is not None:
            self.cache.explicit_ends = True  # absent from a batch is not ended: calls arrive as agents make them
        self.ended: deque[int] = deque()  # executions that returned, raised or timed out
        self._rows: dict[int, set[int]] = {}  # the rows (branches) each execution's calls were sampled on

    def sampled(self, batch: list[Request]) -> None:
        """Note the row of each call of ``batch`` as its execution's."""
        if self.cache is not None:
            for request in batch:
                self._rows.setdefault(request.owner, set()).add(request.row)

    def drop(self, rows: Iterable[int] = ()) -> None:
        """Drop the caches of ``rows`` and of every row of the executions that ended."""
        dropped = list(rows)
        while self.ended:
            dropped.extend(self._rows.pop(self.ended.popleft(), ()))
        if self.cache is not None:
            self.cache.finish(dropped)


async def _run_all(
    agent: Callable[..., Any],
    rows: Sequence[dict[str, Any]],
    executions: list[AgentExecution],
    sampler: Any,
    tokenizer: PreTrainedTokenizerBase,
    parser: ToolCallParser,
    limits: AgentLimits,
    ended: deque[int],
    offload: Callable[..., Any] = asyncio.to_thread,
) -> AgentStats:
    """Every execution, concurrently; each one's index is put in ``ended`` when it returns, raises or times out; each
    gathered batch sampled through ``offload`` (:class:`~lightning_grpo.rollout.agent_client.gather.CallGatherer`)."""
    gatherer = CallGatherer(sampler, len(executions), limits.window, offload)
    stats = AgentStats(executions=len(executions))
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    endpoints = [
        TrajectoryEndpoint(e.recorder, gatherer, i, parser, decode, limits.model, limits.call_timeout)
        for i, e in enumerate(executions)
    ]
    async with _clients(endpoints, limits) as clients:

        async def one(index: int, execution: AgentExecution) -> None:
            try:
                value = await asyncio.wait_for(agent(clients[index], dict(rows[execution.row])), limits.timeout)
                execution.reward = _reward(value)
            except Exception as err:  # any failure of the user's agent: the execution gets no reward
                execution.error = (
                    err
                    if not isinstance(err, TimeoutError)
                    else TimeoutError(f"the agent ran past agent_timeout={limits.timeout} s")
                )
                stats.failures.append((index, execution.error))
            finally:
                execution.calls = endpoints[index].calls
                ended.append(index)
                gatherer.finished()

        await _drive([asyncio.ensure_future(one(i, e)) for i, e in enumerate(executions)], gatherer)
    stats.batches = list(gatherer.batches)
    return stats


async def _drive(tasks: list[asyncio.Task], gatherer: CallGatherer) -> None:  # type: ignore[type-arg]
    """Run the agents' tasks and the gatherer's sampling until all end; on any error every one is cancelled."""
    sampling = asyncio.ensure_future(gatherer.run())
    try:
        done, _ = await asyncio.wait([sampling, asyncio.gather(*tasks)], return_when=asyncio.FIRST_COMPLETED)
        if sampling in done:
            sampling.result()  # a sampling error ends the rollout (it is raised here)
        await asyncio.gather(*tasks)
        await sampling
    finally:
        for task in [*tasks, sampling]:
            task.cancel()
        await asyncio.gather(*tasks, sampling, return_exceptions=True)


@contextlib.asynccontextmanager
async def _clients(endpoints: list[TrajectoryEndpoint], limits: AgentLimits) -> AsyncIterator[list[Any]]:
    """The client each agent is given: in process, or an ``AsyncOpenAI`` on the loopback server (started here,
    stopped on the way out, with the agents' shared HTTP connections, also on an error)."""
    from lightning_grpo.rollout.agent_client import client  # openai: an extra

    if limits.transport == "in_process":
        yield [client.PolicyClient(endpoint) for endpoint in endpoints]
        return
    from lightning_grpo.rollout.agent_client.server import AgentServer  # starlette, uvicorn: the http extra

    per = client.AGENTS_PER_POOL
    pools = [client.loopback_http_client(per) for _ in range(0, len(endpoints), per)]
    try:
        async with AgentServer(limits.model, limits.port) as server:
            yield [
                client.http_client_for(server.url, server.register(e), limits.call_timeout, pools[i // per])
                for i, e in enumerate(endpoints)
            ]
    finally:
        await asyncio.gather(*(pool.aclose() for pool in pools))


def _reward(value: Any) -> float | None:
    """The agent's return value as a reward: a number or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"an agent must return a float or None (its trajectory's reward), got {value!r:.100}")
    return float(value)


def _rollout(
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    executions: list[AgentExecution],
    g: int,
    stats: AgentStats,
) -> Rollout:
    """One row per branch of every trajectory, in trajectory order; group ids are the batch rows."""
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
    """Whether the rollout was built by :func:`run_agents` (its rows are branches)."""
    return "agent_last" in rollout.columns
