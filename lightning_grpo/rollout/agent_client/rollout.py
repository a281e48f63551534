"""A rollout driven by the user's own agent code: ``async def agent(client, row) -> reward``, run G times per row.

Every execution (one trajectory) gets its own :class:`~lightning_grpo.rollout.agent_client.client.PolicyClient` and
recorder; all executions of the batch go concurrently in one event loop, their calls gathered into batched sampling
calls (:mod:`~lightning_grpo.rollout.agent_client.batch_sampler`). The rollout's rows are the branches of every
trajectory (one or more each; :mod:`~lightning_grpo.rollout.agent_client.branch_rows`); see ``docs/agents.md``, "Your
own agent code".
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents import ToolCallParser
from lightning_grpo.extras import require
from lightning_grpo.rollout.agent_client.agent_types import AgentExecution, AgentLimits, AgentStats
from lightning_grpo.rollout.agent_client.batch_sampler import CacheEnds, batch_sampler
from lightning_grpo.rollout.agent_client.branch_rows import branch_rollout
from lightning_grpo.rollout.agent_client.gather import BatchSampler, CallGatherer
from lightning_grpo.rollout.agent_client.handling import TrajectoryEndpoint
from lightning_grpo.rollout.agent_client.main_thread import MainThreadCalls
from lightning_grpo.rollout.agent_client.recorder import TrajectoryRecorder
from lightning_grpo.rollout.batch import Rollout
from lightning_grpo.rollout.generation import eval_mode
from lightning_grpo.rollout.sampling_settings import SampleFn, SamplingSettings
from lightning_grpo.rollout.session import RolloutSession

__all__ = ["agent_reward", "check_agent", "module_agent", "run_agents"]

log = logging.getLogger(__name__)


def check_agent(agent: Any) -> Callable[..., Any]:
    """``agent`` itself if it is an ``async def agent(client, row)``; an import path is imported first.

    Raises:
        TypeError: It is not a coroutine function.
    """
    if isinstance(agent, str):
        module, _, name = agent.rpartition(".")
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
    next_row, prompts = itertools.count().__next__, {}  # branch rows; rendered prompts: shared by the recorders
    recorder = partial(TrajectoryRecorder, tokenizer, settings.max_new_tokens, max_prompt_length, next_row, prompts)
    g = settings.num_generations
    executions = [AgentExecution(b, recorder()) for b in range(len(rows)) for _ in range(g)]
    ends = CacheEnds(sample)
    sampler = batch_sampler(model, tokenizer, settings, sample, ends)
    calls = MainThreadCalls()  # the agents' loop in a worker thread; each batch sampled here (main_thread.py)
    with eval_mode(model):
        running = _run_all(agent, rows, executions, sampler, tokenizer, parser, limits, ends.ended, calls.call)
        stats = calls.run(running)
    ends.drop()  # the executions that returned after the last batch
    for index, error in stats.failures:
        row = executions[index].row
        log.warning("agent execution %d (batch row %d) failed: %s: %s", index, row, type(error).__name__, error)
    return branch_rollout(tokenizer, rows, executions, stats), stats


async def _run_all(
    agent: Callable[..., Any],
    rows: Sequence[dict[str, Any]],
    executions: list[AgentExecution],
    sampler: BatchSampler,
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
    decode = partial(tokenizer.decode, skip_special_tokens=True)
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
                if isinstance(err, TimeoutError):
                    err = TimeoutError(f"the agent ran past agent_timeout={limits.timeout} s")
                execution.error = err
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
