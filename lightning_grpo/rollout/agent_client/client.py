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

import asyncio
import functools
import json
import time
import uuid
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from lightning_grpo.agents import ToolCallParser
from lightning_grpo.rollout.agent_client.gather import CallGatherer
from lightning_grpo.rollout.agent_client.messages import normalize_messages, normalize_tools
from lightning_grpo.rollout.agent_client.recorder import TrajectoryRecorder

__all__ = ["PolicyClient"]

_NO_ROUTE = (
    "the in-process policy client serves the chat completions API only: call client.chat.completions.create(...) "
    "(with the OpenAI Agents SDK: OpenAIChatCompletionsModel(model=..., openai_client=client))"
)


class PolicyClient(openai.AsyncOpenAI):
    """An ``AsyncOpenAI`` answering from the policy, for one trajectory (see the module docstring).

    Args:
        recorder: The trajectory's recorder.
        gatherer: The rollout's call gatherer.
        owner: The trajectory's number (the gatherer counts waiting agents by it).
        parser: Reads content and tool calls from sampled text.
        decode: Token ids to text (special tokens removed).
        model: The model name served (requests naming another are refused).
        call_timeout: Seconds a call may wait for its answer; then ``openai.APITimeoutError`` is raised.
    """

    def __init__(self, recorder: TrajectoryRecorder, gatherer: CallGatherer, owner: int, parser: ToolCallParser,
                 decode: Any, *, model: str = "policy", call_timeout: float = 60.0) -> None:  # fmt: skip
        super().__init__(api_key="in-process", base_url="http://policy.invalid/v1", max_retries=0,
                         http_client=_unused_http_client())  # fmt: skip
        self.recorder, self.gatherer, self.owner, self.parser = recorder, gatherer, owner, parser
        self.decode, self.model, self.call_timeout = decode, model, call_timeout
        self.calls = 0
        self._chat = _Chat(self)

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
        max_tokens = _check_options(model, self.model, options)
        normalized, tools = normalize_messages(messages), normalize_tools(options.get("tools"))
        plan = self.recorder.plan(normalized, tools)
        cap = plan.budget if max_tokens is None else min(plan.budget, max_tokens)
        if cap <= 0:  # the trajectory's budget is spent: nothing is sampled or recorded
            return _completion(self.model, "", [], "length", plan.context, [], [], self.decode, options)
        try:
            tokens, logprobs, ended = await asyncio.wait_for(
                self.gatherer.submit(plan.context, cap, plan.row, self.owner),
                self.call_timeout,
            )
        except TimeoutError:
            raise openai.APITimeoutError(request=_request()) from None
        turn = self.parser.parse(self.decode(tokens))
        calls = [c for c in turn.tool_calls if c.error is None]
        reply = _reply(turn.content, calls)
        self.recorder.record(plan, tokens, logprobs, ended, normalize_messages([reply])[0])
        self.calls += 1
        reason = "length" if not ended else "tool_calls" if calls else "stop"
        return _completion(self.model, turn.content, reply.get("tool_calls", []), reason, plan.context, tokens,
                           logprobs, self.decode, options)  # fmt: skip


class _Completions:
    def __init__(self, client: PolicyClient) -> None:
        self._client = client

    async def create(self, **kwargs: Any) -> ChatCompletion:
        return await self._client.create(**kwargs)


class _Chat:
    def __init__(self, client: PolicyClient) -> None:
        self.completions = _Completions(client)


def _check_options(model: str, served: str, options: dict[str, Any]) -> int | None:
    """The call's ``max_tokens``; refuses a model not served, streaming and ``n > 1``."""
    if model != served:
        raise ValueError(f"model {model!r} is not served by the policy client; it serves {served!r} (client.model)")
    if options.get("stream"):
        raise ValueError("stream=True is not supported by the in-process policy client; call without stream")
    if (options.get("n") or 1) != 1:
        raise ValueError(f"n={options['n']} is not supported: make n separate calls (each is one sampled reply)")
    limit = options.get("max_completion_tokens") or options.get("max_tokens")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"max_tokens must be a positive integer, got {limit!r}")
    return limit


def _reply(content: str, calls: list[Any]) -> dict[str, Any]:
    """The assistant message of a parsed turn in OpenAI form (arguments as a JSON string)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls
        ]  # fmt: skip
    return message


def _completion(
    model: str,
    content: str,
    calls: list[dict[str, Any]],
    reason: str,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    decode: Any,
    options: dict[str, Any],
) -> ChatCompletion:
    """The ``ChatCompletion`` of one sampled reply, with token ids and log-probs when asked."""
    message = {"role": "assistant", "content": content if content or not calls else None, "tool_calls": calls or None}
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None, "message": message}
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                  "total_tokens": len(prompt) + len(tokens)},
    }  # fmt: skip
    if options.get("logprobs"):
        choice["logprobs"] = {"content": [
            {"token": decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]}  # fmt: skip
    if (options.get("extra_body") or {}).get("return_token_ids"):
        choice["token_ids"], body["prompt_token_ids"] = list(tokens), list(prompt)
    return ChatCompletion.model_validate(body)


@functools.cache
def _unused_http_client() -> Any:
    """One HTTP client for every policy client: never used (no request leaves the process), but the SDK builds one,
    and building one per client (an SSL context each) would cost more than the sampling."""
    return openai.DefaultAsyncHttpxClient()


def _request() -> Any:
    try:
        import httpx2 as httpx  # the transport of recent openai releases
    except ImportError:  # pragma: no cover - older openai releases
        import httpx  # type: ignore[no-redef]
    return httpx.Request("POST", "http://policy.invalid/v1/chat/completions")
