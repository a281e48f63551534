"""The agents' event loop in a worker thread, their batched sampling calls on the calling (main) thread.

The gathered batch used to be sampled in ``asyncio.to_thread``'s worker: a thread whose OpenMP team is not the main
thread's (and, with ``asyncio.run`` per rollout, a new one each rollout), so on a CPU with two threads an agent
rollout cost 1.9x the ordinary rollout of the same tokens, 1.05x with one thread (docs/benchmarks.md, "Agent-code
rollouts"). Here the thread roles are swapped: the agents' coroutines (light: messages, tools, HTTP) run on an event
loop in a worker thread, and every sampling call is handed to the thread that called :meth:`MainThreadCalls.run`,
which runs them one at a time, as the training step's own forwards run.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["MainThreadCalls"]

T = TypeVar("T")
_DONE = object()


class MainThreadCalls:
    """Runs one coroutine on an event loop in a worker thread while the calling thread serves its :meth:`call` s."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run on the thread in :meth:`run` (awaited from the worker's event loop)."""
        future = asyncio.get_running_loop().create_future()
        self._calls.put((fn, args, future))
        return await future

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` in a worker thread, serving its :meth:`call` s here until it ends; its result or error.

        An exception here (a ``KeyboardInterrupt``, a sampling error raised into the coroutine) cancels the coroutine,
        and the worker is joined before this returns or raises: no thread outlives the call.
        """
        outcome: dict[str, Any] = {}
        worker = threading.Thread(
            target=self._work, args=(coroutine, outcome), name="lightning_grpo-agents", daemon=True
        )
        worker.start()
        try:
            self._serve()
        except BaseException:
            self._cancel()
            raise
        finally:
            worker.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _work(self, coroutine: Coroutine[Any, Any, T], outcome: dict[str, Any]) -> None:
        async def main() -> T:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            return await coroutine

        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as error:  # raised on the calling thread by run()
            outcome["error"] = error
        finally:
            self._calls.put(_DONE)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not _DONE:
            fn, args, future = item
            try:
                value, error = fn(*args), None
            except Exception as raised:  # the coroutine gets it, as asyncio.to_thread would give it
                value, error = None, raised
            future.get_loop().call_soon_threadsafe(_settle, future, value, error)

    def _cancel(self) -> None:
        """Cancel the coroutine, and every call it still makes, until the worker ends."""
        self._stop()
        while (item := self._calls.get()) is not _DONE:
            future = item[2]
            future.get_loop().call_soon_threadsafe(future.cancel)
            self._stop()  # the loop may have started only now

    def _stop(self) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to cancel
                loop.call_soon_threadsafe(task.cancel)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile (a call timeout): its result is dropped
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
