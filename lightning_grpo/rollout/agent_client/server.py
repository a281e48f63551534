"""The loopback HTTP server of ``agent_transport="http"``: ``/v1/chat/completions`` and ``/v1/models`` on 127.0.0.1.

It runs in the rollout's event loop (uvicorn + starlette, the ``http`` extra) for the length of one rollout and
answers every request with :func:`~lightning_grpo.rollout.agent_client.handling.answer`, the in-process client's
semantics. **One key per trajectory**: ``Authorization: Bearer <key>`` names the trajectory a request belongs to; a
request without a known key gets 401. Other refusals: 400 (a body that is not a chat-completions request, ``stream``,
``n > 1``), 404 (a model not served), 504 (the call waited past ``agent_call_timeout``; nothing was recorded).

**Retries do not fork a trajectory.** The SDK retries a request it got no answer to with the same body and a rising
``x-stainless-retry-count`` (an ``Idempotency-Key`` header, where a client sends one, identifies it too). The first
request's answer goes on being sampled when its client gives up, and a retry of it (same key, same body or same
idempotency key) waits for that same answer instead of sampling again: the trajectory records one reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lightning_grpo.rollout.agent_client.handling import RequestRefused, TrajectoryEndpoint, answer

__all__ = ["AgentServer", "bind_loopback"]

HOST = "127.0.0.1"


@dataclass
class _Trajectory:
    endpoint: TrajectoryEndpoint
    answers: dict[str, asyncio.Task] = field(default_factory=dict)  # type: ignore[type-arg]


def bind_loopback(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (``port`` 0: a free port).

    Raises:
        OSError: The port is in use (the message names it and the setting that chose it).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise OSError(
                err.errno,
                f"port {port} on {HOST} is in use, so the agent server cannot listen there: choose another "
                "GRPOConfig.agents.agent_http_port, or 0 for a free port",
            ) from err
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class AgentServer:
    """The HTTP server of one rollout (see the module docstring); ``async with`` starts and stops it.

    Args:
        model: The model name served.
        port: The port on 127.0.0.1; 0 picks a free one.
    """

    def __init__(self, model: str = "policy", port: int = 0) -> None:
        self.model, self.port = model, port
        self._trajectories: dict[str, _Trajectory] = {}
        self._socket: socket.socket | None = None
        self._server: Any = None
        self._task: asyncio.Task | None = None  # type: ignore[type-arg]
        self.requests = 0

    @property
    def url(self) -> str:
        """The base URL agents use (``OPENAI_BASE_URL``), e.g. ``http://127.0.0.1:40123/v1``."""
        return f"http://{HOST}:{self.port}/v1"

    def register(self, endpoint: TrajectoryEndpoint) -> str:
        """A new key for ``endpoint``'s trajectory (``OPENAI_API_KEY``)."""
        key = f"sk-trajectory-{endpoint.owner}-{secrets.token_urlsafe(12)}"
        self._trajectories[key] = _Trajectory(endpoint)
        return key

    async def __aenter__(self) -> AgentServer:
        import uvicorn

        self._socket = bind_loopback(self.port)
        self.port = self._socket.getsockname()[1]
        # log_config=None: uvicorn's loggers go through the process's logging, not re-configured at every rollout
        config = uvicorn.Config(
            self._app(),
            lifespan="off",
            log_level="warning",
            access_log=False,
            log_config=None,
            timeout_keep_alive=30,
            limit_concurrency=None,
        )
        self._server = uvicorn.Server(config)
        # Ctrl-C and SIGTERM stay the trainer's: uvicorn would catch them for the rollout and re-raise them after it
        self._server.install_signal_handlers = lambda: None  # uvicorn < 0.29
        self._server.capture_signals = contextlib.nullcontext  # uvicorn >= 0.29
        self._task = asyncio.ensure_future(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():  # it failed to start: raise why
                self._task.result()
                raise RuntimeError("the agent HTTP server stopped before it started")
            await asyncio.sleep(0.001)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop serving: pending answers are cancelled, connections closed, the port released.

        The server stops at once: uvicorn's own exit waits for its next 0.1 s tick and then 0.1 s more (0.2 s per
        rollout), so the listener and the connections (idle once every agent is done) are closed here and the serving
        task cancelled; uvicorn's graceful exit is the fallback where its attributes differ.
        """
        pending = [t for trajectory in self._trajectories.values() for t in trajectory.answers.values()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            if _close_now(self._server):
                self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=5.0)  # neither raises its error nor cancels it
            if not done:
                self._server.force_exit = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._task, 5.0)
            elif not self._task.cancelled():
                self._task.exception()  # a failure while stopping must not hide the rollout's own error: read, dropped
        if self._socket is not None:
            self._socket.close()
        self._server = self._task = self._socket = None

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def _trajectory(self, request: Request) -> _Trajectory | None:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        return self._trajectories.get(key.strip()) if scheme.lower() == "bearer" else None

    async def _models(self, request: Request) -> JSONResponse:
        if self._trajectory(request) is None:
            return _unauthorized()
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "lightning_grpo"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _chat(self, request: Request) -> JSONResponse:
        self.requests += 1
        trajectory = self._trajectory(request)
        if trajectory is None:
            return _unauthorized()
        raw = await request.body()
        try:
            body = _chat_body(raw)
            task = self._answer(trajectory, request, raw, body)
            return JSONResponse(await asyncio.shield(task))
        except RequestRefused as err:
            return _error(err.status, str(err), "invalid_request_error")
        except TimeoutError:
            return _error(504, "the call waited past agent_call_timeout; nothing was recorded", "timeout")

    def _answer(self, trajectory: _Trajectory, request: Request, raw: bytes, body: dict[str, Any]) -> asyncio.Task:  # type: ignore[type-arg]
        """The task answering this request: a retry's earlier one where there is one, else a new one."""
        idempotency = request.headers.get("idempotency-key")
        retried = idempotency is not None or request.headers.get("x-stainless-retry-count", "0") not in ("", "0")
        same = f"key:{idempotency}" if idempotency is not None else "body:" + hashlib.sha256(raw).hexdigest()
        earlier = trajectory.answers.get(same)
        if retried and earlier is not None and not (earlier.done() and (earlier.cancelled() or earlier.exception())):
            return earlier
        messages, model = body.pop("messages"), body.pop("model")
        task = asyncio.ensure_future(answer(trajectory.endpoint, messages, model, body))
        trajectory.answers[same] = task
        return task


def _close_now(server: Any) -> bool:
    """Stop ``server`` (a started ``uvicorn.Server``) listening and close its connections, as its own shutdown does
    but without its waits; ``False`` (nothing done) where its attributes are not uvicorn's known ones."""
    listeners, state = getattr(server, "servers", None), getattr(server, "server_state", None)
    if not isinstance(listeners, list) or not hasattr(state, "connections"):
        return False
    for listener in listeners:
        listener.close()
    for connection in list(state.connections):
        connection.shutdown()  # an idle keep-alive connection closes now; a busy one after its response
    return True


def _chat_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, checked to be a chat-completions request."""
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise RequestRefused(f"the body is not JSON: {err}") from None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or "model" not in body:
        raise RequestRefused(
            "the body is not a chat-completions request: a JSON object with 'model' (a string) and 'messages' "
            f"(a list of chat messages) is expected, got {raw[:200]!r}"
        )
    return body


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def _unauthorized() -> JSONResponse:
    return _error(
        401,
        "a valid trajectory key is required: Authorization: Bearer <OPENAI_API_KEY of the run>",
        "authentication_error",
    )
