"""Chat message validation and the check that a chat template renders tools."""

from __future__ import annotations

import pytest

from lightning_grpo.agents import check_chat_template_supports_tools, validate_messages
from lightning_grpo.testing.chat_template import TINY_CHAT_TEMPLATE

CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}


def test_valid_conversation():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "name": "add", "content": "1"},
        {"role": "assistant", "content": "done"},
    ]
    assert validate_messages(messages) == messages


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("hello", "must be a list of chat messages"),
        ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be a dict"),
        ([{"role": "bot", "content": "a"}], r"messages\[0\] has role 'bot'; the allowed roles are system, user"),
        ([{"content": "a"}], r"messages\[0\] has role None"),
        ([{"role": "user"}], r"messages\[0\] \(role 'user'\) has no 'content'"),
        ([{"role": "user", "content": None}], "content of type NoneType"),
        ([{"role": "assistant", "content": None}], "None only for an assistant message with tool_calls"),
        ([{"role": "tool", "content": 5}], "content of type int"),
    ],
)
def test_invalid_messages_name_the_index(messages, match):
    with pytest.raises(ValueError, match=match):
        validate_messages(messages)


def test_name_appears_in_errors():
    with pytest.raises(ValueError, match=r"the prompt of row 3\[0\]"):
        validate_messages([{"role": "x", "content": ""}], name="the prompt of row 3")


def test_tiny_template_supports_tools(tokenizer):
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    check_chat_template_supports_tools(tokenizer)  # no error


IGNORES_TOOLS = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
RENDERS_CALLS_NOT_TOOLS = (  # names the tool in the call, but never lists the tools
    "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.name }}{% endfor %}\n"
    "{% endfor %}"
)
DROPS_TOOL_MESSAGES = (
    "{% for t in tools or [] %}{{ t.function.name }}\n{% endfor %}"
    "{% for m in messages if m.role != 'tool' %}{{ m.content }}\n{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "match"),
    [
        (None, "has no chat template"),
        (IGNORES_TOOLS, "does not render tools"),
        (RENDERS_CALLS_NOT_TOOLS, "does not render tools"),
        (DROPS_TOOL_MESSAGES, "does not render tool results"),
        ("{{ raise_exception('no tools here') }}", "failed to render.*no tools here"),
    ],
)
def test_template_without_tools_is_refused_naming_the_tokenizer(tokenizer, template, match):
    tokenizer.chat_template = template
    tokenizer.name_or_path = "my/tokenizer"
    with pytest.raises(ValueError, match=match) as info:
        check_chat_template_supports_tools(tokenizer)
    assert "'my/tokenizer'" in str(info.value)
