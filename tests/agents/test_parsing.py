"""Tool-call parsing: the Hermes form, several calls, and malformed calls as call-level errors."""

from __future__ import annotations

import pytest

from lightning_grpo.agents import (
    HermesToolCallParser,
    ResponseTemplateParser,
    ToolCallParser,
    assistant_message,
)

parser = HermesToolCallParser()


def test_valid_call_and_content():
    turn = parser.parse('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert isinstance(parser, ToolCallParser)
    assert turn.content == "Let me add."
    assert [(call.name, call.arguments, call.error) for call in turn.tool_calls] == [("add", {"a": 1, "b": 2}, None)]
    assert turn.errors == []


def test_no_call_is_plain_content():
    turn = parser.parse("  The answer is 5.  ")
    assert turn.content == "The answer is 5." and turn.tool_calls == [] and turn.errors == []


def test_several_calls_in_order():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {"x": [1, 2]}}</tool_call>'
    )
    turn = parser.parse(text)
    assert [call.name for call in turn.tool_calls] == ["a", "b"]
    assert turn.tool_calls[1].arguments == {"x": [1, 2]}
    assert turn.content == "and"


def test_arguments_as_json_string_or_missing():
    turn = parser.parse(
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call><tool_call>{"name": "now"}</tool_call>'
    )
    assert [call.arguments for call in turn.tool_calls] == [{"a": 3}, {}]
    assert turn.errors == []


@pytest.mark.parametrize(
    ("body", "name", "error"),
    [
        ('{"name": "add", "arguments": {"a": 1}', "add", "not valid JSON"),
        ('{"arguments": {"a": 1}}', "", 'no "name"'),
        ('{"name": "add", "arguments": [1, 2]}', "add", "must be a JSON object, got an array"),
        ('{"name": "add", "arguments": "{oops"}', "add", "string that is not valid JSON"),
        ("[1, 2]", "", "must be a JSON object"),
    ],
)
def test_malformed_call_is_a_call_level_error(body, name, error):
    turn = parser.parse(f'ok <tool_call>{body}</tool_call> then <tool_call>{{"name": "fine"}}</tool_call>')
    bad, good = turn.tool_calls
    assert bad.name == name and error in bad.error and bad.arguments == {}
    assert good.name == "fine" and good.error is None  # one bad call does not spoil the others
    assert turn.errors == [bad.error]


def test_unclosed_call_is_an_error():
    turn = parser.parse('Hi <tool_call>{"name": "add", "arguments": {"a"')
    assert turn.content == "Hi"
    assert turn.tool_calls[0].name == "add"
    assert "not closed" in turn.tool_calls[0].error


def test_unknown_tool_name_is_parsed_as_written():
    # unknown names are the executor's business (status "unknown_tool"); the parser keeps the name
    turn = parser.parse('<tool_call>{"name": "teleport", "arguments": {}}</tool_call>')
    assert turn.tool_calls[0].name == "teleport" and turn.tool_calls[0].error is None


def test_assistant_message_lists_only_wellformed_calls():
    turn = parser.parse('x<tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call><tool_call>{bad</tool_call>')
    message = assistant_message(turn)
    assert message == {
        "role": "assistant",
        "content": "x",
        "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": {"k": 1}}}],
    }
    assert "tool_calls" not in assistant_message(parser.parse("plain"))


def test_custom_tags():
    turn = HermesToolCallParser("<call>", "</call>").parse('<call>{"name": "a"}</call>')
    assert turn.tool_calls[0].name == "a"
    with pytest.raises(ValueError, match="non-empty"):
        HermesToolCallParser("", "</call>")


HERMES_RESPONSE_TEMPLATE = {
    "start_anchor": "A:\n",
    "fields": {
        "content": {"content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "content": "json",
            "repeats": True,
            "transform": {"type": "function", "function": "{content}"},
        },
    },
}


def test_response_template_adapter():
    adapter = ResponseTemplateParser(response_template=HERMES_RESPONSE_TEMPLATE)
    turn = adapter.parse('hi <tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call>')
    assert turn.content == "hi"
    assert [(call.name, call.arguments) for call in turn.tool_calls] == [("a", {"k": 1})]
    # transformers fails the whole turn on one malformed call: one call carrying the error
    broken = adapter.parse('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": </tool_call>')
    assert len(broken.tool_calls) == 1 and "could not be parsed" in broken.tool_calls[0].error


def test_response_template_adapter_needs_a_template(tokenizer):
    with pytest.raises(ValueError, match="no response_template"):
        ResponseTemplateParser(tokenizer)
