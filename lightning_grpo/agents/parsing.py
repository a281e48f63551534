"""Tool-call parsing: from the text of one assistant turn to its content and tool calls.

The parser is a replaceable piece: anything with ``parse(text) -> ParsedTurn`` is a :class:`ToolCallParser`. The
default, :class:`HermesToolCallParser`, reads the form Qwen2.5, Qwen3 and Hermes models write::

    Let me compute that.
    <tool_call>
    {"name": "calc", "arguments": {"expression": "2+3"}}
    </tool_call>

A call the parser cannot read (malformed JSON, no ``name``, ``arguments`` that are not an object, an unclosed tag)
is not an exception: it is a :class:`ToolCall` whose ``error`` is set, which the executor turns into the content of
the tool message the model sees next, so the model can learn to fix it.

transformers (5.x) also parses responses, with ``tokenizer.parse_response`` driven by a ``response_template`` dict
that a few tokenizers ship. It fails the whole turn on one malformed call and most tokenizers have no template, so it
is offered as :class:`ResponseTemplateParser`, not as the default.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "HermesToolCallParser",
    "ParsedTurn",
    "ResponseTemplateParser",
    "ToolCall",
    "ToolCallParser",
    "assistant_message",
    "call_from_json",
]


@dataclass(frozen=True)
class ToolCall:
    """One tool call written by the policy.

    Attributes:
        name: The tool's name (``""`` when the call could not be read far enough to find one).
        arguments: Keyword arguments for the tool (``{}`` for a call that could not be parsed).
        error: Why the call could not be parsed, or ``None`` for a well-formed call. A call with an error is not run;
            the error becomes the content of its tool message.
        raw: The text of the call as the policy wrote it (between the tags).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The call as an entry of an assistant message's ``tool_calls`` (the form chat templates read)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedTurn:
    """One parsed assistant turn.

    Attributes:
        content: The turn's text outside the tool calls, stripped.
        tool_calls: Every call, in order, including those that could not be parsed (their ``error`` is set).
        errors: The parse errors of the turn, in order (one per call with an ``error``), for logging and metrics.
    """

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@runtime_checkable
class ToolCallParser(Protocol):
    """Reads the content and the tool calls of one assistant turn's text (special tokens already removed)."""

    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn.

        Args:
            text: The decoded text the policy generated in this turn.

        Returns:
            The turn's content and tool calls; never raises for malformed calls.
        """
        ...


def assistant_message(turn: ParsedTurn) -> dict[str, Any]:
    """The assistant message of a parsed turn, as chat templates and reward functions see it.

    Only well-formed calls are listed in ``tool_calls``; a call that could not be parsed appears only through the
    error in its tool message. ``tool_calls`` is left out when there are none.
    """
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    calls = [call.to_dict() for call in turn.tool_calls if call.error is None]
    if calls:
        message["tool_calls"] = calls
    return message


def call_from_json(body: str) -> ToolCall:
    """A :class:`ToolCall` from the JSON of one call, ``{"name": ..., "arguments": {...}}``, never raising.

    ``arguments`` may also be a JSON string holding an object (as OpenAI-style APIs write it), or be absent (no
    arguments). ``parameters`` is accepted in place of ``arguments``, as some models write it.
    """
    raw = body.strip()
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as err:
        return ToolCall(
            name=_guess_name(raw), error=f"the tool call is not valid JSON ({err.msg} at char {err.pos})", raw=raw
        )
    if not isinstance(payload, dict):
        return ToolCall(name="", error=f"the tool call must be a JSON object, got {_json_type(payload)}", raw=raw)
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", error='the tool call has no "name" (a non-empty string)', raw=raw)
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return ToolCall(name=name, error=f'"arguments" is a string that is not valid JSON ({err.msg})', raw=raw)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        error = f'"arguments" must be a JSON object, got {_json_type(arguments)}'
        return ToolCall(name=name, error=error, raw=raw)
    return ToolCall(name=name, arguments=arguments, raw=raw)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


def _guess_name(raw: str) -> str:
    """The tool name of a call whose JSON is malformed, if it can be read, else ``""`` (used in error messages)."""
    match = _NAME_RE.search(raw)
    return match.group(1) if match else ""


class HermesToolCallParser:
    """Parser for ``<tool_call>{json}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes; the tiny test template).

    Several calls per turn are read in order. The content is the text outside the blocks, stripped. A ``<tool_call>``
    without its closing tag (a turn cut by the token budget) is a call with an error.

    Args:
        open_tag: The tag that opens a call.
        close_tag: The tag that closes a call.

    Example::

        parser = HermesToolCallParser()
        turn = parser.parse('Sure.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
        turn.content, turn.tool_calls[0].arguments  # ("Sure.", {"a": 1, "b": 2})
    """

    def __init__(self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>") -> None:
        if not open_tag or not close_tag:
            raise ValueError(f"open_tag and close_tag must be non-empty strings, got {open_tag!r} and {close_tag!r}.")
        self.open_tag = open_tag
        self.close_tag = close_tag

    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn (see :class:`ToolCallParser`)."""
        pieces: list[str] = []
        calls: list[ToolCall] = []
        position = 0
        while (start := text.find(self.open_tag, position)) != -1:
            pieces.append(text[position:start])
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            if end == -1:
                raw = text[body_start:].strip()
                error = f"the tool call is not closed with {self.close_tag}"
                calls.append(ToolCall(name=_guess_name(raw), error=error, raw=raw))
                position = len(text)
                break
            calls.append(call_from_json(text[body_start:end]))
            position = end + len(self.close_tag)
        pieces.append(text[position:])
        errors = [call.error for call in calls if call.error is not None]
        return ParsedTurn(content="".join(pieces).strip(), tool_calls=calls, errors=errors)


class ResponseTemplateParser:
    """Adapter to transformers' response parsing (``tokenizer.parse_response`` and a ``response_template``).

    Use it for a model family whose tokenizer ships a ``response_template`` (or pass one). transformers parses the
    turn as a whole: one malformed call fails the turn, which then becomes a single call with an error (the model
    sees the message), and the turn's calls are lost.

    Args:
        tokenizer: A tokenizer with a ``response_template`` attribute (transformers >= 5), or ``None`` when
            ``response_template`` is given.
        response_template: The template dict; defaults to the tokenizer's.

    Raises:
        ValueError: Neither gives a response template.
    """

    def __init__(self, tokenizer: Any = None, response_template: dict[str, Any] | None = None) -> None:
        template = response_template or getattr(tokenizer, "response_template", None)
        if template is None:
            name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
            raise ValueError(
                f"Tokenizer {name!r} has no response_template, so transformers cannot parse its tool calls; pass "
                "response_template=... or use HermesToolCallParser (or your own ToolCallParser)."
            )
        self.response_template = template

    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn (see :class:`ToolCallParser`)."""
        from transformers.utils.chat_parsing.response_parser import parse_response

        try:
            message = parse_response(text, self.response_template, prefix="")
        except (ValueError, KeyError, TypeError) as err:
            error = f"the tool calls could not be parsed: {str(err).splitlines()[0]}"
            return ParsedTurn(
                content=text.strip(), tool_calls=[ToolCall(name="", error=error, raw=text)], errors=[error]
            )
        calls = [_call_from_message_entry(entry) for entry in message.get("tool_calls") or []]
        errors = [call.error for call in calls if call.error is not None]
        content = message.get("content") or ""
        return ParsedTurn(
            content=content.strip() if isinstance(content, str) else str(content), tool_calls=calls, errors=errors
        )


def _call_from_message_entry(entry: Any) -> ToolCall:
    """A :class:`ToolCall` from one ``tool_calls`` entry of a parsed message (``{"function": {...}}`` or flat)."""
    function = entry.get("function", entry) if isinstance(entry, dict) else entry
    return call_from_json(json.dumps(function))
