"""Running the tool calls of a turn concurrently, each with a timeout, never raising.

All calls of a turn (of every trajectory still running) are passed as one flat list and run at the same time:

- ``async`` tools are awaited on one event loop, which :class:`ToolExecutor` keeps in a background thread for its
  whole life (so tools that hold loop-bound resources, such as HTTP sessions, keep working from step to step);
- sync tools run each in a thread of their own (at most ``max_workers`` at once).

Each call has a timeout. A sync tool that hangs cannot be stopped (Python cannot kill a thread): when its timeout
passes, the call's result is the timeout message and its thread is *abandoned*: it is a daemon thread, it no longer
counts against ``max_workers``, and it does not keep the interpreter alive at exit. Its eventual result is dropped.
:attr:`ToolExecutor.abandoned_threads` counts those still running. An ``async`` tool that blocks the event loop
(``time.sleep`` inside ``async def``) cannot be timed out either; write blocking tools as sync functions.

Whatever goes wrong with a call becomes the content of its tool message, an error string the model sees:

| ``status`` | when |
| --- | --- |
| ``ok`` | the tool returned; its value is the content (non-strings as JSON) |
| ``error`` | the tool raised, or the arguments do not fit its signature |
| ``timeout`` | the tool did not return within the timeout |
| ``unknown_tool`` | no tool has the called name |
| ``parse_error`` | the call could not be parsed (its `ToolCall.error` is set) |
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from lightning_grpo.agents.parsing import ToolCall
from lightning_grpo.agents.tools import Tool, ToolSet
from lightning_grpo.settings_checks import check_number

__all__ = ["FatalToolError", "ToolExecutor", "ToolResult", "ToolStatus", "execute_tool_calls", "format_tool_output"]

ToolStatus = Literal["ok", "error", "timeout", "unknown_tool", "parse_error"]


class FatalToolError(RuntimeError):
    """A tool failure that must stop the run rather than become a message (an MCP server gone, with ``on_exit="stop"``).

    :class:`ToolExecutor` re-raises it; every other exception of a tool becomes the tool message.
    """


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call.

    Attributes:
        call: The call.
        content: The tool message's content: the tool's output, or an error message starting with ``"Error: "``.
        status: One of ``"ok"``, ``"error"``, ``"timeout"``, ``"unknown_tool"``, ``"parse_error"``.
        duration_s: Wall-clock seconds the call took (0 for calls that were not run).
    """

    call: ToolCall
    content: str
    status: ToolStatus
    duration_s: float = 0.0

    def to_message(self) -> dict[str, Any]:
        """The tool message for the chat template: ``{"role": "tool", "name": ..., "content": ...}``."""
        return {"role": "tool", "name": self.call.name, "content": self.content}


def format_tool_output(value: Any) -> str:
    """A tool's return value as message content: strings as they are, others as JSON, else ``str(value)``."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class ToolExecutor:
    """Runs tool calls concurrently with a timeout each (see the module docs for how hung tools are handled).

    Args:
        tools: The tools (a :class:`ToolSet` or callables).
        timeout: Seconds each call may take, > 0.
        max_workers: Most sync tools running at once (further calls wait for a slot; their timeout starts when they
            start), >= 1.
        max_output_chars: Longest tool message content, in characters; longer outputs are cut and end with
            ``"... [truncated]"``. ``None`` keeps them whole.

    Example::

        executor = ToolExecutor([calc], timeout=2.0)
        results = executor.run(calls)  # list[ToolResult], one per call, in order
        executor.close()
    """

    def __init__(
        self,
        tools: ToolSet | Sequence[Any],
        *,
        timeout: float = 10.0,
        max_workers: int = 32,
        max_output_chars: int | None = None,
    ) -> None:
        check_number("timeout", timeout, minimum=0.0, exclusive_minimum=True)  # seconds
        check_number("max_workers", max_workers, integer=True, minimum=1)
        check_number("max_output_chars", max_output_chars, integer=True, minimum=1, allow_none=True)
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.timeout = float(timeout)
        self.max_workers = max_workers
        self.max_output_chars = max_output_chars
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._abandoned: list[threading.Thread] = []
        self._lock = threading.Lock()

    @property
    def abandoned_threads(self) -> int:
        """How many threads of timed-out sync tools are still running."""
        self._abandoned = [thread for thread in self._abandoned if thread.is_alive()]
        return len(self._abandoned)

    def run(self, calls: Sequence[ToolCall], toolsets: Sequence[ToolSet | None] | None = None) -> list[ToolResult]:
        """Run the calls concurrently and wait for all of them (at most about the timeout per wave of workers).

        Args:
            calls: The calls of a turn, of all trajectories, as one flat list.
            toolsets: The tools each call may use (one per call: a trajectory's own environment's tools); ``None``,
                or a ``None`` entry: this executor's :attr:`tools`.

        Returns:
            One result per call, in the order of ``calls``. Never raises for a failing call, except a
            :class:`FatalToolError`.
        """
        if not calls:
            return []
        loop = self._ensure_loop()
        future: Future[list[ToolResult]] = asyncio.run_coroutine_threadsafe(self.arun(calls, toolsets), loop)
        return future.result()

    async def arun(
        self, calls: Sequence[ToolCall], toolsets: Sequence[ToolSet | None] | None = None
    ) -> list[ToolResult]:
        """Coroutine form of :meth:`run`; must run on this executor's loop (use :meth:`run` from other code)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_workers)
        if toolsets is not None and len(toolsets) != len(calls):
            raise ValueError(f"Got {len(calls)} calls but {len(toolsets)} toolsets; pass one per call.")
        tools = [self.tools if toolsets is None or ts is None else ts for ts in (toolsets or [None] * len(calls))]
        results = await asyncio.gather(*(self._run_one(call, ts) for call, ts in zip(calls, tools, strict=True)))
        return [self._truncate(result) for result in results]

    def close(self) -> None:
        """Stop the event loop thread. Threads of hung tools are left to finish (they are daemon threads)."""
        with self._lock:
            loop, thread = self._loop, self._loop_thread
            self._loop, self._loop_thread, self._slots = None, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5.0)
            if not thread.is_alive():
                loop.close()

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _truncate(self, result: ToolResult) -> ToolResult:
        limit, marker = self.max_output_chars, "... [truncated]"
        if limit is None or len(result.content) <= limit:
            return result
        content = result.content[: max(limit - len(marker), 0)] + marker
        return ToolResult(result.call, content[:limit], result.status, result.duration_s)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(
                    target=self._loop.run_forever, name="lightning_grpo-tools", daemon=True
                )
                self._loop_thread.start()
            return self._loop

    async def _run_one(self, call: ToolCall, tools: ToolSet) -> ToolResult:
        if call.error is not None:
            return ToolResult(call, f"Error: {call.error}.", "parse_error")
        tool = tools.get(call.name)
        if tool is None:
            content = f"Error: unknown tool {call.name!r}; the tools are {', '.join(map(repr, tools.names))}."
            return ToolResult(call, content, "unknown_tool")
        if (problem := _argument_problem(tool, call.arguments)) is not None:
            return ToolResult(call, f"Error: bad arguments for tool {tool.name!r}: {problem}.", "error")
        start = time.perf_counter()
        try:
            if tool.is_async:
                value = await asyncio.wait_for(tool.function(**call.arguments), self.timeout)
            else:
                value = await self._run_in_thread(tool, call.arguments, start)
        except asyncio.TimeoutError:
            content = f"Error: tool {tool.name!r} timed out after {self.timeout} s."
            return ToolResult(call, content, "timeout", time.perf_counter() - start)
        except FatalToolError:
            raise
        except Exception as err:  # the tool's own failure: shown to the model, never raised
            content = f"Error: tool {tool.name!r} raised {type(err).__name__}: {err}"
            return ToolResult(call, content, "error", time.perf_counter() - start)
        return ToolResult(call, format_tool_output(value), "ok", time.perf_counter() - start)

    async def _run_in_thread(self, tool: Tool, arguments: dict[str, Any], start: float) -> Any:
        """Run a sync tool in a daemon thread; on timeout the thread is abandoned (see the module docs)."""
        assert self._slots is not None
        async with self._slots:
            loop = asyncio.get_running_loop()
            result: asyncio.Future[Any] = loop.create_future()

            def settle(error: BaseException | None, value: Any) -> None:
                if result.done():  # timed out already: the late result is dropped
                    return
                if error is not None:
                    result.set_exception(error)
                else:
                    result.set_result(value)

            def target() -> None:
                error: BaseException | None = None
                value = None
                try:
                    value = tool.function(**arguments)
                except Exception as err:  # handed to the loop, which reports it as the tool's error
                    error = err
                except BaseException as err:  # SystemExit & co. must not escape into the event loop
                    error = RuntimeError(f"{type(err).__name__}: {err}")
                with contextlib.suppress(RuntimeError):  # RuntimeError: the executor closed while this thread ran
                    loop.call_soon_threadsafe(settle, error, value)

            thread = threading.Thread(target=target, name=f"lightning_grpo-tool-{tool.name}", daemon=True)
            thread.start()
            try:
                return await asyncio.wait_for(result, self.timeout)
            except asyncio.TimeoutError:
                self._abandoned.append(thread)
                raise


def _argument_problem(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's signature (missing, unexpected), or ``None`` when they do."""
    if tool.signature is None:
        return None
    try:
        tool.signature.bind(**arguments)
    except TypeError as err:
        return str(err)
    return None


def execute_tool_calls(
    calls: Sequence[ToolCall],
    tools: ToolSet | Sequence[Any],
    *,
    timeout: float = 10.0,
    max_workers: int = 32,
    max_output_chars: int | None = None,
) -> list[ToolResult]:
    """Run tool calls once with a temporary :class:`ToolExecutor` (see there for the arguments).

    For a training loop, keep one :class:`ToolExecutor` instead: it keeps its event loop from step to step.
    """
    with ToolExecutor(tools, timeout=timeout, max_workers=max_workers, max_output_chars=max_output_chars) as executor:
        return executor.run(calls)
