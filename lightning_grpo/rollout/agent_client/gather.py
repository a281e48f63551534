"""Gathering the concurrent calls of running agents into batched sampling calls.

**The rule**: a batch is sampled as soon as every live agent (one not finished) is waiting on at least one call, or,
while calls wait, when ``window`` seconds pass with no new call and no agent finishing (the other agents are busy
with their own work: a tool, a sleep). All calls waiting at that moment are sampled together, in one call of the
rollout backend, in trajectory order (not arrival order, which differs between the in-process client and HTTP);
calls that arrive meanwhile wait for the next batch. The sampler prefills a context shared by several calls of the
batch once (:mod:`~lightning_grpo.rollout.agent_client.grouping`). A call cancelled before its batch (a timeout)
is left out; one cancelled during it has its result dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["BatchSampler", "CallGatherer", "Request", "SampledCall"]


@dataclass
class Request:
    """One waiting call: its context, token cap, row (branch), trajectory, and whether it starts a new branch
    (``shared``: it may share its prefill with other calls of the same context)."""

    context: list[int]
    max_tokens: int
    row: int
    owner: int
    shared: bool
    future: asyncio.Future = field(repr=False)  # type: ignore[type-arg]


class SampledCall(NamedTuple):
    """What one call was answered with.

    Attributes:
        tokens: The sampled tokens, cut after the end-of-turn token or at the call's cap.
        logprobs: Their behaviour log-probs (under the kept set the sampler drew from).
        ended: Whether the turn ended with an end-of-turn token.
        margins: Their kept-set margins (:attr:`Sampled.margins
            <lightning_grpo.rollout.sampling_settings.Sampled.margins>`); ``None`` when the sampling truncates nothing.
    """

    tokens: list[int]
    logprobs: list[float]
    ended: bool
    margins: list[float] | None = None


#: Samples a batch of requests (in trajectory order): one :class:`SampledCall` per request.
BatchSampler = Callable[[list[Request]], list[SampledCall]]


class CallGatherer:
    """Batches the calls of the agents of one rollout (see the module docstring).

    Args:
        sample: Samples one batch (run by ``offload``, so agents' own coroutines go on meanwhile).
        live: Number of agents running at the start.
        window: Longest wait, in seconds, for the other agents' calls before a batch is sampled.
        offload: Awaits ``sample(batch)`` run off the event loop's thread: ``asyncio.to_thread``, or
            :meth:`MainThreadCalls.call <lightning_grpo.rollout.agent_client.main_thread.MainThreadCalls.call>`
            (the thread that runs the rollout samples, the agents' loop runs in a worker).
    """

    def __init__(
        self, sample: BatchSampler, live: int, window: float, offload: Callable[..., Awaitable[Any]] = asyncio.to_thread
    ) -> None:
        self.sample, self.live, self.window, self.offload = sample, live, window, offload
        self.waiting: list[Request] = []
        self.batches: list[int] = []  # size of each sampled batch (the batching measurement)
        self._wake = asyncio.Event()

    async def submit(
        self, context: list[int], max_tokens: int, row: int, owner: int, *, shared: bool = False
    ) -> SampledCall:
        """Wait for the call to be sampled in a batch: its tokens, their log-probs, whether it ended its turn, and
        their kept-set margins."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(Request(context, max_tokens, row, owner, shared, future))
        self._wake.set()
        return await future

    def finished(self) -> None:
        """One agent is done (returned, raised or timed out)."""
        self.live -= 1
        self._wake.set()

    def _ready(self) -> bool:
        self.waiting = [r for r in self.waiting if not r.future.done()]  # cancelled calls leave
        return bool(self.waiting) and len({r.owner for r in self.waiting}) >= self.live

    async def run(self) -> None:
        """Sample batches until every agent has finished (cancel the task to stop it early)."""
        while self.live > 0:
            self._wake.clear()
            if not self._ready():
                try:
                    timeout = self.window if self.waiting else None
                    await asyncio.wait_for(self._wake.wait(), timeout)
                    continue
                except TimeoutError:
                    self.waiting = [r for r in self.waiting if not r.future.done()]
                    if not self.waiting:
                        continue
            batch, self.waiting = sorted(self.waiting, key=lambda r: r.owner), []  # trajectory order, not arrival
            self.batches.append(len(batch))
            results = await self.offload(self.sample, batch)
            for request, result in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result(result)
