"""A short chat template for the tiny character-level tokenizer, with tools.

It has the shape of Qwen2.5's template, made short because tiny models have small contexts. Each turn is a one-letter
role tag (``S`` system, ``U`` user, ``A`` assistant, ``T`` tool), a newline, the content, and ``<eos>`` (the tiny
tokenizer's end-of-turn and EOS token), then a newline. Tools, when given, are listed in the system turn as compact
JSON (name, description, parameters), one per line. Tool calls are written inside assistant turns in the Hermes
form that :class:`~lightning_grpo.agents.HermesToolCallParser` reads,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
``add_generation_prompt`` adds the assistant header ``A:\\n``. For example::

    S:
    Tools:
    {"name":"add","description":"Add two integers.","parameters":{...}}<eos>
    U:
    2+3?<eos>
    A:
    <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><eos>
    T:
    5<eos>
    A:

Rendering a conversation that ends with a user or tool turn with ``add_generation_prompt=True`` gives a prefix of the
rendering of the same conversation continued by an assistant turn, so a rollout can append turns token by token.
"""

from __future__ import annotations

__all__ = ["TINY_CHAT_TEMPLATE"]

_NL = "{{ '\\n' }}"  # a newline; literal ones after a block tag would be eaten by transformers' trim_blocks

#: The tiny tokenizer's chat template (Jinja, as ``tokenizer.chat_template``).
TINY_CHAT_TEMPLATE = (
    "{% set has_system = messages and messages[0].role == 'system' %}"
    "{% if has_system or tools %}S:"
    + _NL
    + "{% if has_system %}{{ messages[0].content }}{% if tools %}"
    + _NL
    + "{% endif %}{% endif %}"
    "{% if tools %}Tools:{% for tool in tools %}"
    + _NL
    + "{% set fn = tool.function if tool.function is defined else tool %}"
    "{{ dict(name=fn.name, description=fn.description, parameters=fn.parameters) | tojson(separators=[',', ':']) }}"
    "{% endfor %}{% endif %}<eos>" + _NL + "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}U:"
    + _NL
    + "{{ message.content }}<eos>"
    + _NL
    + "{% elif message.role == 'assistant' %}A:"
    + _NL
    + "{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% set call = call.function if call.function is defined else call %}"
    '<tool_call>{"name": "{{ call.name }}", "arguments": '
    "{% if call.arguments is string %}{{ call.arguments }}{% else %}{{ call.arguments | tojson }}{% endif %}}"
    "</tool_call>{% endfor %}<eos>"
    + _NL
    + "{% elif message.role == 'tool' %}T:"
    + _NL
    + "{{ message.content }}<eos>"
    + _NL
    + "{% elif message.role != 'system' or not loop.first %}"
    "{{ raise_exception('The tiny chat template supports the roles system (first only), user, assistant and tool, "
    "got ' ~ message.role) }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:" + _NL + "{% endif %}"
)
