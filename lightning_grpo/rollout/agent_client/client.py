"""The in-process client an agent is given: an ``openai.AsyncOpenAI`` whose chat completions the policy answers.

No HTTP is involved: ``client.chat.completions.create(...)`` renders the messages with the policy's chat template,
waits for the call's batch (:mod:`~lightning_grpo.rollout.agent_client.gather`), records the sampled tokens
(:mod:`~lightning_grpo.rollout.agent_client.recorder`) and returns a ``ChatCompletion`` as vLLM's server does:
``message.content`` and ``message.tool_calls`` (read by the run's tool-call parser), ``finish_reason``
(``"stop"``, ``"tool_calls"`` or ``"length"``), ``usage``; ``logprobs=True`` adds per-token log-probs;
``extra_body={"return_token_ids": True}`` adds ``choices[0].token_ids`` and ``prompt_token_ids``.

Sampling settings are the run's: a request's ``temperature``, ``top_p``, ``seed``, ``stop`` and the like are
ignored. ``max_tokens`` (or ``max_completion_tokens``) caps the call within what is left of the trajectory's budget.
``stream=True``, ``n > 1``, the Responses API and the legacy completions API are refused with a message.
"""

from __future__ import annotations

import functools
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from lightning_grpo.rollout.agent_client.handling import TrajectoryEndpoint, answer

__all__ = ["AGENTS_PER_POOL", "IN_PROCESS_URL", "PolicyClient", "http_client_for", "loopback_http_client"]

#: The base URL of the in-process client: no request is sent there (``.invalid`` never resolves).
IN_PROCESS_URL = "http://policy.invalid/v1"

_NO_ROUTE = (
    "the in-process policy client serves the chat completions API only: call client.chat.completions.create(...) "
    "(with the OpenAI Agents SDK: OpenAIChatCompletionsModel(model=..., openai_client=client))"
)


class PolicyClient(openai.AsyncOpenAI):
    """An ``AsyncOpenAI`` answering from the policy, for one trajectory (see the module docstring).

    Args:
        endpoint: The trajectory's recorder, the rollout's gatherer, the parser, model name and call timeout
            (the semantics are :func:`~lightning_grpo.rollout.agent_client.handling.answer`'s, shared with the
            HTTP server).
    """

    def __init__(self, endpoint: TrajectoryEndpoint) -> None:
        # the SDK's own __init__ (URL parsing, auth, an HTTP client) gives every client the same state: built once
        self.__dict__.update(_sdk_state())
        self.endpoint, self.model = endpoint, endpoint.model
        self._chat = _Chat(self)

    @property
    def calls(self) -> int:
        """Calls answered so far."""
        return self.endpoint.calls

    @property
    def chat(self) -> Any:  # type: ignore[override]
        """``chat.completions.create``, answered by the policy."""
        return self._chat

    @property
    def responses(self) -> Any:  # type: ignore[override]
        """Refused: the Responses API is not served (the error names the chat completions route)."""
        raise NotImplementedError(_NO_ROUTE)

    @property
    def completions(self) -> Any:  # type: ignore[override]
        """Refused: the legacy completions API is not served."""
        raise NotImplementedError(_NO_ROUTE)

    async def create(self, *, messages: Any, model: str, **options: Any) -> ChatCompletion:
        """One chat completion (``chat.completions.create``'s body)."""
        try:
            body = await answer(self.endpoint, messages, model, options)
        except TimeoutError:
            raise openai.APITimeoutError(request=_request()) from None
        return ChatCompletion.model_validate(body)


class _Completions:
    def __init__(self, client: PolicyClient) -> None:
        self._client = client

    async def create(self, **kwargs: Any) -> ChatCompletion:
        return await self._client.create(**kwargs)


class _Chat:
    def __init__(self, client: PolicyClient) -> None:
        self.completions = _Completions(client)


@functools.cache
def _sdk_state() -> dict[str, Any]:
    """The attributes ``AsyncOpenAI.__init__`` gives an in-process client, made once: every policy client shares
    them (its HTTP client is never used, as no request leaves the process). Building them per client costs about as
    much as the rest of its call (the base URL alone is parsed twice)."""
    sdk = openai.AsyncOpenAI(
        api_key="in-process", base_url=IN_PROCESS_URL, max_retries=0, http_client=openai.DefaultAsyncHttpxClient()
    )
    return dict(vars(sdk))


def _httpx() -> Any:
    try:
        import httpx2 as httpx  # the transport of recent openai releases
    except ImportError:  # pragma: no cover - older openai releases
        import httpx  # type: ignore[no-redef]
    return httpx


def _request() -> Any:
    return _httpx().Request("POST", "http://policy.invalid/v1/chat/completions")


def loopback_http_client(connections: int) -> Any:
    """An HTTP client for ``connections`` agents of an ``agent_transport="http"`` rollout: a connection for each
    (a small pool at high concurrency turns waits into timeouts and retries), no TLS, no proxy from the environment.

    The rollout gives each :data:`AGENTS_PER_POOL` agents one such client: httpcore's pool assigns requests to
    connections in time quadratic in their number, and a client per agent costs a few milliseconds to build.
    """
    httpx = _httpx()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return openai.DefaultAsyncHttpxClient(limits=limits, trust_env=False, verify=False)


#: Agents sharing one HTTP client (one connection pool) in an ``agent_transport="http"`` rollout.
AGENTS_PER_POOL = 16


def http_client_for(url: str, key: str, call_timeout: float, http_client: Any) -> openai.AsyncOpenAI:
    """The ``AsyncOpenAI`` a Python agent gets with ``agent_transport="http"``: the server's URL and the trajectory's
    key; its timeout outlasts the server's own (``agent_call_timeout``, answered with 504), the SDK's retries on.

    The SDK looks up the platform (for its headers) in a worker thread at each client's first request: a thread hop
    per agent, and a thread pool grown for it, at every rollout. The clients made here are given it, looked up once.
    """
    client = openai.AsyncOpenAI(base_url=url, api_key=key, timeout=call_timeout + 10.0, http_client=http_client)
    if getattr(client, "_platform", False) is None:  # an SDK that keeps it there (openai >= 1)
        client._platform = _platform()
    return client


@functools.cache
def _platform() -> Any:
    """The SDK's platform headers' source, looked up once per process (``None``: let the SDK look it up)."""
    try:
        from openai._base_client import get_platform
    except ImportError:  # pragma: no cover - an SDK that moved it
        return None
    return get_platform()
