"""The tiny chat template: its rendering, EOS-terminated assistant turns, tools, and agreement with the parser."""

from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateError

from lightning_grpo.agents import HermesToolCallParser, ToolSet
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.chat_template import TINY_CHAT_TEMPLATE


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "content": "5"},
    {"role": "assistant", "content": "5"},
]


@pytest.fixture
def tokenizer():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TINY_CHAT_TEMPLATE  # the tiny tokenizer may already carry it; be explicit
    return tokenizer


def render(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_rendering_without_tools(tokenizer):
    assert render(tokenizer, CONVERSATION) == (
        "S:\nBe brief.<eos>\n"
        "U:\n2+3?<eos>\n"
        'A:\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><eos>\n'
        "T:\n5<eos>\n"
        "A:\n5<eos>\n"
    )
    assert render(tokenizer, CONVERSATION[1:2], add_generation_prompt=True) == "U:\n2+3?<eos>\nA:\n"


def test_tools_are_listed_only_when_given(tokenizer):
    with_tools = render(tokenizer, CONVERSATION[1:2], tools=ToolSet([add]).schemas, add_generation_prompt=True)
    assert with_tools.startswith('S:\nTools:\n{"name":"add","description":"Add two integers.","parameters":{')
    assert with_tools.endswith("<eos>\nU:\n2+3?<eos>\nA:\n")
    assert "Tools:" not in render(tokenizer, CONVERSATION[1:2])
    both = render(tokenizer, CONVERSATION[:2], tools=[add])
    assert both.startswith("S:\nBe brief.\nTools:\n{")


def test_assistant_turns_end_with_the_eos_token(tokenizer):
    ids = tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    eos_positions = [i for i, token in enumerate(tokens) if token == tokenizer.eos_token]
    assert len(eos_positions) == len(CONVERSATION)  # one <eos> token per turn, never spelled out in characters
    assert tokens[-3:] == ["5", tokenizer.eos_token, "\n"]  # the final assistant turn: its text, then EOS
    assert tokenizer.eos_token_id in ids
    # each assistant turn's text ends right before an <eos> token
    text = render(tokenizer, CONVERSATION)
    assert text.count("</tool_call><eos>") == 1 and text.endswith("A:\n5<eos>\n")


def test_generation_prompt_is_a_prefix_of_the_continued_conversation(tokenizer):
    for end in (2, 4):  # after the user turn, after the tool turn
        prompt = render(tokenizer, CONVERSATION[:end], tools=[add], add_generation_prompt=True)
        assert render(tokenizer, CONVERSATION[: end + 1], tools=[add]).startswith(prompt)


def test_rendered_calls_parse_back(tokenizer):
    prompt = render(tokenizer, CONVERSATION[:2], add_generation_prompt=True)
    turn_text = render(tokenizer, CONVERSATION[:3])[len(prompt) :].removesuffix("<eos>\n")
    turn = HermesToolCallParser().parse(turn_text)
    assert turn.content == "" and turn.errors == []
    assert [(call.name, call.arguments) for call in turn.tool_calls] == [("add", {"a": 2, "b": 3})]


def test_string_arguments_are_written_as_given(tokenizer):
    call = {"function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}
    text = render(tokenizer, [{"role": "assistant", "content": "x", "tool_calls": [call]}])
    assert text == 'A:\nx<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call><eos>\n'


def test_unsupported_roles_are_refused(tokenizer):
    with pytest.raises(TemplateError, match="got narrator"):
        render(tokenizer, [{"role": "narrator", "content": "x"}])
    with pytest.raises(TemplateError, match="system \\(first only\\)"):
        render(tokenizer, [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])
