"""The URL and key of an agent's client as environment variables, for an agent program run as a subprocess."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["agent_env"]


def agent_env(client: Any, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` of ``client``.

    With ``GRPOConfig(agents=AgentConfig(agent_transport="http"))`` the client an agent is given points at the rollout's
    loopback server and holds its trajectory's key; a subprocess started with this environment (``openai.OpenAI()``
    reads both variables) sends its calls to that trajectory.

    Args:
        client: The client the agent was given.
        base: The environment to extend; ``None`` copies ``os.environ``.

    Raises:
        ValueError: ``client`` is the in-process client, which no other process can reach.
    """
    url = str(client.base_url).rstrip("/")
    if ".invalid" in url:
        raise ValueError(
            "the in-process policy client cannot be reached from another process: set "
            "GRPOConfig(agents=AgentConfig(agent_transport='http')) to serve the policy on 127.0.0.1 (allowed: "
            "'in_process', 'http')"
        )
    env = dict(os.environ if base is None else base)
    env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY=str(client.api_key))
    return env
