"""Per-call and per-rollout work the agent routes no longer repeat: the SDK's client state built once, the platform
looked up once, the loopback server stopped without uvicorn's graceful waits."""

from __future__ import annotations

import asyncio
import socket

import openai
import uvicorn

from lightning_grpo.rollout.agent_client.client import (
    IN_PROCESS_URL,
    PolicyClient,
    http_client_for,
    loopback_http_client,
)
from lightning_grpo.rollout.agent_client.server import AgentServer


def test_policy_clients_share_the_sdks_state_but_answer_their_own_trajectory():
    first, second = PolicyClient(_Endpoint(0)), PolicyClient(_Endpoint(1))
    assert isinstance(first, openai.AsyncOpenAI) and str(first.base_url) == IN_PROCESS_URL + "/"
    assert first.api_key == "in-process" and first.max_retries == 0
    assert first._client is second._client  # one (never used) HTTP client, not one per agent
    assert first.endpoint.owner == 0 and second.endpoint.owner == 1 and first.chat is not second.chat


def test_http_clients_are_given_the_platform_so_no_thread_looks_it_up():
    client = http_client_for("http://127.0.0.1:9/v1", "key", 1.0, loopback_http_client(1))
    assert client._platform is not None and client.api_key == "key"


def test_the_server_stops_without_uvicorns_graceful_waits(monkeypatch):
    """uvicorn's own exit waits for its next 0.1 s tick and sleeps 0.1 s more; the rollout's server closes the
    listener and an idle keep-alive connection itself, so uvicorn's shutdown never runs."""
    shutdowns = []
    monkeypatch.setattr(uvicorn.Server, "shutdown", lambda self, sockets=None: shutdowns.append(1))

    async def serve_one_request() -> tuple[int, str]:
        async with loopback_http_client(1) as client:
            async with AgentServer() as server:
                reply = await client.get(f"{server.url}/models")  # 401 without a key; the connection stays open
            return reply.status_code, server.url

    status, url = asyncio.run(serve_one_request())
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    assert status == 401 and shutdowns == []


class _Endpoint:
    model = "policy"
    calls = 0

    def __init__(self, owner: int) -> None:
        self.owner = owner
