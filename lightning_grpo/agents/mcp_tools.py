"""MCP tool servers as tools: a stdio command or a streamable-HTTP URL in ``tools=``, beside Python functions.

A server entry is a dict (in Python or YAML)::

    {"command": ["python", "server.py"], "env": {"TOKEN": "..."}}   # stdio: a subprocess of this process
    {"url": "http://127.0.0.1:8000/mcp"}                          # streamable HTTP

Other keys: ``cwd``, ``name``, ``startup_timeout`` (default 30 s) and ``on_exit`` (a server dying mid-run: ``"stop"``
the run, the default, or ``"continue"`` with tool messages saying so). At set-up the server starts and its tools are
listed with their JSON schemas, offered like Python tools and run by the same
:class:`~lightning_grpo.agents.execution.ToolExecutor` (concurrency, timeout, errors as the tool message).

One session per server per process, on an event loop in a background thread, reused across steps; a pickled server
(a spawned DDP rank) reconnects in its process on first use. ``GRPOModule`` closes its servers at the end of fit and
on an exception (:class:`~lightning_grpo.callbacks.tool_servers.CloseToolServers`), an ``atexit`` hook any left open.
``mcp`` is imported only when a server starts, and checked when one is built (the ``mcp`` extra:
``pip install ".[mcp]"`` in a clone); docs/agents.md has the details.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Literal

from lightning_grpo.agents.execution import FatalToolError
from lightning_grpo.agents.tools import Tool
from lightning_grpo.extras import require
from lightning_grpo.settings_checks import check_number

__all__ = [
    "MCPServerError",
    "MCPServerExitedError",
    "MCPToolError",
    "MCPToolServer",
    "is_server_entry",
    "server_tools",
    "split_tools",
]

_KEYS = {"command", "url", "env", "cwd", "name", "startup_timeout", "on_exit"}
_OPEN: weakref.WeakSet[MCPToolServer] = weakref.WeakSet()
_START = threading.RLock()  # concurrent first calls (a new process) start a server once


class MCPServerError(RuntimeError):
    """An MCP server did not start or answer; the message names its command or URL and shows its stderr."""


class MCPServerExitedError(FatalToolError):
    """An MCP server with ``on_exit="stop"`` died mid-run: the run stops (the message names it)."""


class MCPToolError(RuntimeError):
    """A tool of an MCP server reported an error (its text becomes the tool message)."""


def is_server_entry(item: Any) -> bool:
    """Whether a ``tools=`` item is an MCP server (a dict with ``command`` or ``url``, or an :class:`MCPToolServer`)."""
    return isinstance(item, MCPToolServer) or (isinstance(item, Mapping) and ("command" in item or "url" in item))


class MCPToolServer:
    """One MCP server (stdio subprocess or streamable HTTP) and its session in this process.

    Args:
        command: The stdio server's command line (a list, or one string split on spaces).
        url: The streamable-HTTP endpoint (``http://host:port/mcp``).
        env: Environment variables of the stdio subprocess (added to the inherited safe defaults of ``mcp``).
        cwd: Working directory of the stdio subprocess.
        name: How messages call the server; defaults to its command or URL.
        startup_timeout: Seconds to start, initialise and list the tools, > 0.
        on_exit: A server that dies mid-run: ``"stop"`` the run, or ``"continue"`` with error tool messages.

    Raises:
        ValueError: Neither or both of ``command`` and ``url``, or a bad setting.

    Example::

        server = MCPToolServer(command=["python", "weather_server.py"])
        tools = server.tools()  # starts it; list[Tool], offered like Python tools
        server.close()
    """

    def __init__(
        self,
        command: Sequence[str] | str | None = None,
        url: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str | None = None,
        startup_timeout: float = 30.0,
        on_exit: Literal["stop", "continue"] = "stop",
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("An MCP server entry needs exactly one of 'command' (stdio) and 'url' (streamable HTTP).")
        self.command = (command.split() if isinstance(command, str) else [str(c) for c in command]) if command else None
        if command is not None and not self.command:
            raise ValueError("An MCP server's 'command' is empty; give the program and its arguments.")
        if on_exit not in ("stop", "continue"):
            raise ValueError(f"on_exit must be 'stop' or 'continue', got {on_exit!r}.")
        check_number("startup_timeout", startup_timeout, minimum=0.0, exclusive_minimum=True)  # seconds
        self.url, self.env, self.cwd = url, dict(env or {}), cwd
        self.startup_timeout, self.on_exit = float(startup_timeout), on_exit
        self.name = name or (" ".join(self.command) if self.command else str(url))
        require("mcp", self.label)  # when the module is built, not in the first rollout
        self._reset_runtime()

    @classmethod
    def of(cls, entry: MCPToolServer | Mapping[str, Any]) -> MCPToolServer:
        """A server from a ``tools=`` entry (a dict as in the module docs); a server is returned as it is.

        Raises:
            ValueError: The dict has keys other than those of the module docs (the message lists them).
        """
        if isinstance(entry, MCPToolServer):
            return entry
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ValueError(
                f"MCP server entry {dict(entry)!r} has unknown keys {unknown}; the keys are {sorted(_KEYS)}."
            )
        return cls(**dict(entry))

    @property
    def label(self) -> str:
        """``stdio server `command``` or ``HTTP server URL``, for messages."""
        return f"MCP stdio server `{self.name}`" if self.command else f"MCP HTTP server {self.name}"

    def start(self) -> None:
        """Start the server (stdio) or connect (HTTP), open the session and list the tools; no-op when open.

        Raises:
            ImportError: ``mcp`` is not installed.
            MCPServerError: The server did not start or answer within ``startup_timeout`` (with its stderr).
        """
        with _START:
            if self._pid != os.getpid() or self._session is None:
                self._start()

    def _start(self) -> None:
        self._reset_runtime()
        require("mcp", self.label)  # again in this process: a pickled server starts in a spawned DDP rank
        self._pid = os.getpid()
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lightning_grpo-mcp", daemon=True)
        self._thread.start()
        ready: Future[list[Any]] = Future()
        self._serving = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            self._listed = ready.result(timeout=self.startup_timeout)
        except FutureTimeout:
            self.close()
            raise MCPServerError(
                f"{self.label} did not answer within {self.startup_timeout} s.{self._tail()}"
            ) from None
        except Exception as err:
            detail = _describe(err)
            self.close()
            raise MCPServerError(f"{self.label} could not be started: {detail}.{self._tail()}") from err
        _OPEN.add(self)

    def tools(self) -> list[Tool]:
        """The server's tools (starting it first), schemas as listed, called through this session."""
        self.start()
        return [self._tool(listed) for listed in self._listed]

    def close(self) -> None:
        """End the session and, for stdio, the subprocess; safe to call twice. A later call reconnects."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive() and self._pid == os.getpid():
            with contextlib.suppress(Exception):  # closing: the server's own errors no longer matter
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=20.0)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5.0)
            if not thread.is_alive():
                loop.close()
        self._stderr_text = self._read_stderr()
        if self._stderr is not None:
            self._stderr.close()
        _OPEN.discard(self)
        text = self._stderr_text
        self._reset_runtime()
        self._stderr_text = text

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_loop", "_thread", "_stderr", "_session", "_stop", "_serving", "_task"):
            state[key] = None
        state["_pid"] = None  # a new process opens its own session on first use
        return state

    def __repr__(self) -> str:
        return f"MCPToolServer({self.label})"

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """Call ``tool`` on the server from any event loop; its text content, or an error (see the module docs).

        Raises:
            MCPToolError: The tool reported an error.
            MCPServerExitedError: The server is gone and ``on_exit="stop"``.
            RuntimeError: The server is gone and ``on_exit="continue"`` (the message says so).
        """
        if self._pid != os.getpid() or self._session is None:
            if self._pid is not None and self._pid == os.getpid():  # was open in this process and went away
                raise self._gone(tool, RuntimeError("the session is closed"))
            await asyncio.to_thread(self.start)
        assert self._loop is not None and self._session is not None
        future = asyncio.run_coroutine_threadsafe(self._session.call_tool(tool, arguments), self._loop)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as err:
            raise self._gone(tool, err) from err
        text = _content_text(result)
        if getattr(result, "is_error", False):
            raise MCPToolError(text or "the tool reported an error without a message")
        return text

    def _reset_runtime(self) -> None:
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stderr: Any = None
        self._stderr_text = ""
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._serving: Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._listed: list[Any] = []

    async def _shutdown(self) -> None:
        """End the serving task: leave its contexts (the stdio subprocess is terminated), cancelling it if need be."""
        task = self._task
        if task is None or task.done():
            return
        if self._stop is not None:  # open: leave the session and the transport in order
            self._stop.set()
            await asyncio.wait({task}, timeout=10.0)
        if not task.done():  # still starting (or stuck): cancel, which unwinds the same contexts
            task.cancel()
            await asyncio.wait({task}, timeout=10.0)

    def _transport(self) -> Any:
        if self.command:
            from mcp import StdioServerParameters
            from mcp.client.stdio import get_default_environment, stdio_client

            env = {**get_default_environment(), **self.env}
            params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=env, cwd=self.cwd)
            return stdio_client(params, errlog=self._stderr)
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(str(self.url))

    async def _serve(self, ready: Future[list[Any]]) -> None:
        """Open the transport and the session, list the tools, then hold them open until :meth:`close`."""
        from mcp import ClientSession

        self._task = asyncio.current_task()
        try:
            async with self._transport() as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                tools, cursor = [], None
                while True:
                    params = None if cursor is None else _paginated(cursor)
                    listed = await session.list_tools(params=params)
                    tools.extend(listed.tools)
                    cursor = listed.next_cursor
                    if not cursor:
                        break
                self._stop = asyncio.Event()
                self._session = session
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err if isinstance(err, Exception) else RuntimeError(repr(err)))
        finally:
            self._session = None

    def _tool(self, listed: Any) -> Tool:
        name = listed.name
        parameters = listed.input_schema or {"type": "object", "properties": {}}
        schema = {
            "type": "function",
            "function": {"name": name, "description": listed.description or "", "parameters": parameters},
        }

        call_tool = _ServerTool(self, name)  # picklable: a spawned rank reconnects on first use
        return Tool(name=name, function=call_tool, schema=schema, is_async=True, signature=None)

    def _gone(self, tool: str, err: BaseException) -> Exception:
        message = (
            f"the {self.label} is no longer running or answering ({_describe(err)}); tool {tool!r} could not be "
            f"called.{self._tail()}"
        )
        return MCPServerExitedError(message) if self.on_exit == "stop" else RuntimeError(message)

    def _read_stderr(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return self._stderr_text
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            return self._stderr.read()
        except (OSError, ValueError):
            return ""

    def _tail(self, limit: int = 2000) -> str:
        if not self.command:
            return ""
        text = self._read_stderr().strip()
        if not text:
            return " The server wrote nothing to stderr."
        return f" Its stderr ends with:\n{text[-limit:]}"


class _ServerTool:
    """One tool of a server as an ``async`` callable (``await tool(**arguments)``); pickles with its server."""

    def __init__(self, server: MCPToolServer, name: str) -> None:
        self.server, self.__name__, self.source = server, name, server.label

    async def __call__(self, **arguments: Any) -> str:
        return await self.server.call(self.__name__, arguments)


def split_tools(items: Sequence[Any]) -> tuple[list[Any], list[MCPToolServer]]:
    """Python tools and MCP servers of a ``tools=`` list (server dicts become :class:`MCPToolServer`)."""
    python, servers = [], []
    for item in items:
        if is_server_entry(item):
            servers.append(MCPToolServer.of(item))
        else:
            python.append(item)
    return python, servers


def server_tools(python: Sequence[Tool], servers: Sequence[MCPToolServer]) -> list[Tool]:
    """The Python tools, then each server's tools (starting the servers).

    Raises:
        ValueError: A tool name is defined twice (the message names both sources: a Python function or a server).
    """
    sources = {tool.name: f"the Python function {getattr(tool.function, '__qualname__', tool.name)}" for tool in python}
    tools = list(python)
    for server in servers:
        for tool in server.tools():
            if tool.name in sources:
                raise ValueError(
                    f"Tool {tool.name!r} is defined twice: by {sources[tool.name]} and by the {server.label}. Tool "
                    "names must be unique because the model calls tools by name; rename one."
                )
            sources[tool.name] = f"the {server.label}"
            tools.append(tool)
    return tools


def _paginated(cursor: str) -> Any:
    from mcp import types

    return types.PaginatedRequestParams(cursor=cursor)


def _content_text(result: Any) -> str:
    """A call result's content as text: text parts joined by newlines, other parts as JSON."""
    parts = []
    for item in getattr(result, "content", None) or []:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(item.model_dump(mode="json"), ensure_ascii=False))
    if not parts and getattr(result, "structured_content", None) is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _describe(err: BaseException) -> str:
    """An exception (or the first of an exception group) as ``Type: message``."""
    while getattr(err, "exceptions", None):  # an exception group (anyio's task groups raise them)
        err = err.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(err).__name__}: {err}"


@atexit.register
def _close_all() -> None:
    for server in list(_OPEN):
        server.close()
