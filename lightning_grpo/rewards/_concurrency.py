"""Running the reward functions of one step together: async ones awaited, sync ones in threads, with timeouts.

See ``docs/rewards.md`` ("Async and slow rewards").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RewardCall", "is_async", "run_calls"]


class _CallFailed(Exception):
    """A call raised (``error`` set) or ran past its timeout (``error`` is ``None``)."""

    def __init__(self, call: RewardCall, error: BaseException | None) -> None:
        super().__init__(call.name)
        self.call, self.error = call, error


@dataclass(frozen=True)
class RewardCall:
    """One reward function call of a step.

    Args:
        name: The reward name, for errors.
        fn: The function.
        args: Positional arguments.
        kwargs: Keyword arguments.
        timeout: Seconds to wait for it; ``None`` waits for ever.
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timeout: float | None = None


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` function, method, partial or ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


def run_calls(calls: Sequence[RewardCall]) -> tuple[list[Any], dict[str, float]]:
    """Run every call concurrently and return their outputs, in order, and the seconds each took.

    A single sync call without a timeout runs in the calling thread (no thread or event loop needed).

    Raises:
        _CallFailed: The first call that raised or timed out (the caller names it in a clear error).
    """
    if len(calls) == 1 and calls[0].timeout is None and not is_async(calls[0].fn):
        call, start = calls[0], time.perf_counter()
        try:
            output = call.fn(*call.args, **call.kwargs)
        except Exception as err:
            raise _CallFailed(call, err) from err
        return [output], {call.name: time.perf_counter() - start}
    return _run_loop(_gather(calls))


def _run_loop(coroutine: Any) -> Any:
    """``asyncio.run(coroutine)``, in a helper thread when this thread already runs an event loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as err:  # re-raised in the caller's thread
            result["error"] = err

    thread = threading.Thread(target=target, name="reward-loop", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


async def _gather(calls: Sequence[RewardCall]) -> tuple[list[Any], dict[str, float]]:
    seconds: dict[str, float] = {}
    outputs = await asyncio.gather(*(_one(call, seconds) for call in calls))
    return list(outputs), seconds


def _in_daemon_thread(loop: asyncio.AbstractEventLoop, call: RewardCall) -> asyncio.Future:
    """Run a sync call in a daemon thread: one past its timeout is abandoned and never keeps the process alive.

    (A ``ThreadPoolExecutor``'s threads are joined at interpreter exit, so a hung reward would hang the exit too.)
    """
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            result, error = call.fn(*call.args, **call.kwargs), None
        except BaseException as err:  # handed to the awaiting coroutine
            result, error = None, err
        with contextlib.suppress(RuntimeError):  # a closed loop: the step gave up on this call at its timeout
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=f"lightning_grpo-reward-{call.name}", daemon=True).start()
    return future


async def _one(call: RewardCall, seconds: dict[str, float]) -> Any:
    loop, start = asyncio.get_running_loop(), time.perf_counter()
    try:
        awaitable = call.fn(*call.args, **call.kwargs) if is_async(call.fn) else _in_daemon_thread(loop, call)
        output = await asyncio.wait_for(awaitable, call.timeout)
        if inspect.isawaitable(output):  # a sync callable that returned a coroutine
            output = await asyncio.wait_for(output, call.timeout)
    except TimeoutError as err:  # asyncio.TimeoutError is TimeoutError; tell ours from one the function raised
        timed_out = call.timeout is not None and time.perf_counter() - start >= call.timeout
        raise _CallFailed(call, None if timed_out else err) from err
    except Exception as err:
        raise _CallFailed(call, err) from err
    seconds[call.name] = time.perf_counter() - start
    return output
