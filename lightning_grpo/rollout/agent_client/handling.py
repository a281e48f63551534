"""One chat-completions request of one trajectory, answered from the policy: the semantics both routes share.

The in-process client (:mod:`~lightning_grpo.rollout.agent_client.client`) and the loopback HTTP server
(:mod:`~lightning_grpo.rollout.agent_client.server`) both call :func:`answer` with the request's fields and return
what it returns: a chat-completion body as a plain dict (the client validates it into a ``ChatCompletion``, the
server sends it as JSON). Refusals raise :class:`RequestRefused` (a ``ValueError`` carrying an HTTP status); a call
that waits past its timeout raises ``TimeoutError`` and leaves no trace in the recorder. No ``openai`` import.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_grpo.agents import ToolCallParser
from lightning_grpo.rollout.agent_client.gather import CallGatherer
from lightning_grpo.rollout.agent_client.openai_messages import normalize_messages, normalize_tools
from lightning_grpo.rollout.agent_client.recorder import TrajectoryRecorder

__all__ = ["RequestRefused", "TrajectoryEndpoint", "answer", "check_options"]


class RequestRefused(ValueError):
    """A request the policy does not serve; ``status`` is the HTTP status the server answers with.

    Args:
        message: What is wrong and what is allowed.
        status: 400 (a bad body or option), 404 (a model not served).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class TrajectoryEndpoint:
    """What answers one trajectory's calls: its recorder, the rollout's gatherer, and how replies are read.

    Attributes:
        recorder: The trajectory's recorder.
        gatherer: The rollout's call gatherer.
        owner: The trajectory's number (the gatherer counts waiting agents by it).
        parser: Reads content and tool calls from sampled text.
        decode: Token ids to text (special tokens removed).
        model: The model name served (requests naming another are refused).
        call_timeout: Seconds a call may wait for its answer; then ``TimeoutError``.
        calls: Calls answered so far.
    """

    recorder: TrajectoryRecorder
    gatherer: CallGatherer
    owner: int
    parser: ToolCallParser
    decode: Callable[[list[int]], str]
    model: str = "policy"
    call_timeout: float = 60.0
    calls: int = 0


async def answer(endpoint: TrajectoryEndpoint, messages: Any, model: Any, options: dict[str, Any]) -> dict[str, Any]:
    """One chat completion of ``endpoint``'s trajectory: sampled, recorded, as a chat-completion body.

    Raises:
        RequestRefused: Another model, ``stream``, ``n > 1``, a bad ``max_tokens``, messages or tools.
        TimeoutError: The call waited longer than ``endpoint.call_timeout`` (nothing is recorded).
    """
    max_tokens = check_options(model, endpoint.model, options)
    try:
        normalized, tools = normalize_messages(messages), normalize_tools(options.get("tools"))
        plan = endpoint.recorder.plan(normalized, tools)
    except RequestRefused:
        raise
    except ValueError as err:
        raise RequestRefused(str(err)) from err
    cap = plan.budget if max_tokens is None else min(plan.budget, max_tokens)
    if cap <= 0:  # the trajectory's budget is spent: nothing is sampled or recorded
        return completion_body(endpoint.model, "", [], "length", plan.context, [], [], endpoint.decode, options)
    submitted = endpoint.gatherer.submit(plan.context, cap, plan.row, endpoint.owner, shared=plan.branch is None)
    tokens, logprobs, ended, margins = await asyncio.wait_for(submitted, endpoint.call_timeout)
    turn = endpoint.parser.parse(endpoint.decode(tokens))
    calls = [c for c in turn.tool_calls if c.error is None]
    reply = _reply(turn.content, calls)
    endpoint.recorder.record(plan, tokens, logprobs, ended, normalize_messages([reply])[0], margins=margins)
    endpoint.calls += 1
    reason = "length" if not ended else "tool_calls" if calls else "stop"
    tool_calls = reply.get("tool_calls", [])
    return completion_body(
        endpoint.model, turn.content, tool_calls, reason, plan.context, tokens, logprobs, endpoint.decode, options
    )


def check_options(model: Any, served: str, options: dict[str, Any]) -> int | None:
    """The call's ``max_tokens``; refuses a model not served, streaming and ``n > 1``.

    Raises:
        RequestRefused: With status 404 for another model, 400 for the rest.
    """
    if model != served:
        raise RequestRefused(f"model {model!r} is not served by the policy client; it serves {served!r}", 404)
    if options.get("stream"):
        raise RequestRefused("stream=True is not supported by the policy client; call without stream")
    if (options.get("n") or 1) != 1:
        raise RequestRefused(f"n={options['n']} is not supported: make n separate calls (each is one sampled reply)")
    limit = options.get("max_completion_tokens") or options.get("max_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise RequestRefused(f"max_tokens must be a positive integer, got {limit!r}")
    return limit


def _reply(content: str, calls: list[Any]) -> dict[str, Any]:
    """The assistant message of a parsed turn in OpenAI form (arguments as a JSON string)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in calls
        ]
    return message


def completion_body(
    model: str,
    content: str,
    calls: list[dict[str, Any]],
    reason: str,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    decode: Callable[[list[int]], str],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The chat-completion body of one sampled reply, with token ids and log-probs when asked."""
    message = {"role": "assistant", "content": content if content or not calls else None, "tool_calls": calls or None}
    choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None, "message": message}
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt) + len(tokens),
        },
    }
    if options.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {"token": decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(tokens, logprobs, strict=True)
            ]
        }
    if options.get("return_token_ids") or (options.get("extra_body") or {}).get("return_token_ids"):
        choice["token_ids"], body["prompt_token_ids"] = list(tokens), list(prompt)
    return body
