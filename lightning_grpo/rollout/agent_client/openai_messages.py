"""Chat messages of an agent's calls: normalised from what the ``openai`` SDK accepts, compared for equality.

An agent sends dicts or the SDK's message objects (``response.choices[0].message`` appended as is). Every message is
normalised to the form chat templates render: ``role``, ``content`` (a string; ``None`` becomes ``""``, a list of text
parts is joined), ``tool_calls`` with ``function.arguments`` parsed to a dict, ``tool_call_id`` and ``name`` kept.

Two messages are **equal** (:func:`message_key`) when their role, content (``None`` equal to ``""``), tool calls (by
name and parsed JSON arguments, in order) and ``tool_call_id`` are equal. Tool-call ids and other fields are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["ROLES", "message_key", "normalize_messages", "normalize_tools", "same_messages"]

#: The roles an agent's message may have (``developer`` is read as ``system``).
ROLES = ("system", "user", "assistant", "tool")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages of one call in template form (see the module docstring).

    Raises:
        ValueError: ``messages`` is not a non-empty list, or a message (named by its index) has an unknown role,
            non-text content, or tool calls whose arguments are not a JSON object.
    """
    if isinstance(messages, str | bytes | dict) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"messages must be a non-empty list of chat messages, got {messages!r:.200}")
    return [_normalize(message, index) for index, message in enumerate(messages)]


def _as_dict(message: Any, where: str) -> dict[str, Any]:
    if hasattr(message, "model_dump"):  # an SDK object (ChatCompletionMessage, a typed param model)
        message = message.model_dump(exclude_none=True)
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be a dict or an openai message object, got {type(message).__name__}")
    return message


def _normalize(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    raw = _as_dict(message, where)
    role = "system" if raw.get("role") == "developer" else raw.get("role")
    if role not in ROLES:
        raise ValueError(f"{where} has role {raw.get('role')!r}; the allowed roles are {', '.join(ROLES)}, developer")
    out: dict[str, Any] = {"role": role, "content": _text(raw.get("content"), where)}
    calls = raw.get("tool_calls") or []
    if calls:
        if role != "assistant":
            raise ValueError(f"{where} (role {role!r}) has tool_calls; only assistant messages may")
        out["tool_calls"] = [_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)]
    for key in ("tool_call_id", "name"):
        if raw.get(key) is not None:
            out[key] = str(raw[key])
    return out


def _text(content: Any, where: str) -> str:
    """A message's content as one string: ``None`` is ``""``, text parts are joined."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, Sequence):
        parts = [part if isinstance(part, dict) else _as_dict(part, where) for part in content]
        if all(part.get("type") == "text" for part in parts):
            return "".join(str(part.get("text", "")) for part in parts)
        kinds = sorted({str(part.get("type")) for part in parts} - {"text"})
        raise ValueError(f"{where} has content parts of type {kinds}; only text parts are supported")
    raise ValueError(f"{where} has content of type {type(content).__name__}; it must be a string or text parts")


def _call(call: Any, where: str) -> dict[str, Any]:
    """One tool call as ``{"id", "type", "function": {"name", "arguments": dict}}``."""
    raw = _as_dict(call, where)
    function = raw.get("function", raw)
    function = function if isinstance(function, dict) else _as_dict(function, where)
    name, arguments = function.get("name"), function.get("arguments") or {}
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} has no function name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} ({name}) has arguments that are not valid JSON ({err.msg})") from err
    if not isinstance(arguments, dict):
        raise ValueError(f"{where} ({name}) has arguments that are not a JSON object")
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": str(raw["id"]), **out} if raw.get("id") is not None else out


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What message equality compares, of a normalised message: role, content, tool calls, ``tool_call_id``."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls", ())
    )
    return message["role"], message["content"], calls, message.get("tool_call_id")


def same_messages(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> bool:
    """Whether two normalised conversations are equal message by message (:func:`message_key`)."""
    return len(a) == len(b) and all(message_key(x) == message_key(y) for x, y in zip(a, b, strict=True))


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A call's ``tools`` as OpenAI function schemas; ``None`` without tools.

    Raises:
        ValueError: A tool (named by its index) is not ``{"type": "function", "function": {"name", "parameters"}}``.
    """
    if not tools:
        return None
    out = []
    for index, tool in enumerate(tools):
        tool = _as_dict(tool, f"tools[{index}]")
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict) or not function.get("name"):
            raise ValueError(f'tools[{index}] must be {{"type": "function", "function": {{"name": ..., ...}}}}')
        if not isinstance(function.get("parameters"), dict):
            raise ValueError(
                f"tools[{index}] ({function['name']}) has no schema: function.parameters must be a JSON schema object"
            )
        out.append({"type": "function", "function": dict(function)})
    return out
