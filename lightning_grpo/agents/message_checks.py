"""Chat messages: validation, and the check that a tokenizer's chat template renders tools.

A conversation is a list of ``{"role": ..., "content": ...}`` dicts (the convention of TRL and Hugging Face datasets).
Roles are ``system``, ``user``, ``assistant`` and ``tool``; ``content`` is a string, or ``None`` for an assistant
message that only calls tools (it then has ``tool_calls``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_grpo.settings_checks import SettingError

__all__ = ["ALLOWED_ROLES", "check_chat_template_supports_tools", "string_prompts_refused", "validate_messages"]

#: The roles a chat message may have.
ALLOWED_ROLES = ("system", "user", "assistant", "tool")


def string_prompts_refused(where: str, prompt: str) -> SettingError:
    """The one-line error for a string ``prompt`` where tools or an environment need chat messages, with the fix.

    Raised by :class:`~lightning_grpo.data.PromptDataModule` when it is set up for a module with tools or an
    environment (before the first rollout) and by the rollout for prompts from any other data module.

    Args:
        where: Where the prompt comes from (``"train_data row 0"``, ``"prompt 0"``).
        prompt: The prompt text (its first 60 characters are quoted).

    Example::

        >>> print(string_prompts_refused("train_data row 0", "3+4="))  # doctest: +ELLIPSIS
        train_data row 0: tools and environment_factory need conversational prompts (chat messages), got the string ...
    """
    return SettingError(
        f"{where}: tools and environment_factory need conversational prompts (chat messages), got the string "
        f"{prompt[:60]!r}; set chat_template=True on the PromptDataModule (in a config: data.init_args.chat_template: "
        'true) to make each text the user turn, or give rows whose prompt is a list of chat messages, e.g. [{"role": '
        '"user", "content": "..."}]',
        "chat_template",
        False,
    )


def validate_messages(messages: Any, *, name: str = "messages") -> list[dict[str, Any]]:
    """Check that ``messages`` is a list of chat messages with known roles and content.

    Args:
        messages: The conversation to check.
        name: What the conversation is, for the error message (e.g. ``"the prompt of row 3"``).

    Returns:
        ``messages`` as a list (the same dicts, not copied).

    Raises:
        ValueError: ``messages`` is not a list of dicts, a message's role is not one of :data:`ALLOWED_ROLES`, or its
            content is missing or not a string (``None`` is allowed only for an assistant message with
            ``tool_calls``). The message names the index of the offending message.
    """
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        raise ValueError(
            f"{name} must be a list of chat messages (dicts with 'role' and 'content'), got {messages!r:.200}."
        )
    for index, message in enumerate(messages):
        _check_message(message, f"{name}[{index}]")
    return list(messages)


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise ValueError(
            f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}: {message!r:.200}."
        )
    role = message.get("role")
    if role not in ALLOWED_ROLES:
        raise ValueError(f"{where} has role {role!r}; the allowed roles are {', '.join(ALLOWED_ROLES)}.")
    content = message.get("content")
    if isinstance(content, str):
        return
    if content is None and role == "assistant" and message.get("tool_calls"):
        return
    if "content" not in message:
        raise ValueError(
            f"{where} (role {role!r}) has no 'content'; every message needs a string content "
            "(None only for an assistant message with tool_calls)."
        )
    raise ValueError(
        f"{where} (role {role!r}) has content of type {type(content).__name__}; content must be a string "
        "(None only for an assistant message with tool_calls)."
    )


_PROBE_NAME = "lightning_grpo_probe_tool"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "A probe.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "string", "description": "x"}},
            "required": ["x"],
        },
    },
}
_PROBE_RESULT = "probe-result-4711"
_PROBE_CONVERSATION = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": _PROBE_NAME, "arguments": {"x": "1"}}}],
    },
    {"role": "tool", "name": _PROBE_NAME, "content": _PROBE_RESULT},
]


def _render_probe(tokenizer: Any, tools: list[dict[str, Any]] | None) -> str:
    return tokenizer.apply_chat_template(_PROBE_CONVERSATION, tools=tools, tokenize=False, add_generation_prompt=True)


def check_chat_template_supports_tools(tokenizer: Any) -> None:
    """Check that the tokenizer's chat template renders tool schemas and tool results.

    transformers silently ignores ``tools=`` (and may drop ``tool`` messages) for templates that do not use them, so a
    model trained with tools would never see them. This renders a tiny conversation with a probe tool, a call to it
    and its result, and checks that passing
    the tool adds its name to the text and that the result appears.

    Args:
        tokenizer: A tokenizer with a chat template (``tokenizer.chat_template``).

    Raises:
        ValueError: The tokenizer has no chat template, its template fails on the probe conversation, or it renders
            no tools or no tool results. The message names the tokenizer.
    """
    label = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"Tokenizer {label!r} has no chat template, so it cannot render tools. Use a chat/instruct model's "
            "tokenizer or set tokenizer.chat_template to a template that renders `tools` and tool messages."
        )
    try:
        with_tools, without_tools = (_render_probe(tokenizer, tools) for tools in ([_PROBE_TOOL], None))
    except Exception as err:  # any template failure means: this template cannot be used with tools
        raise ValueError(
            f"The chat template of tokenizer {label!r} failed to render a conversation with tools, a tool call and a "
            f"tool message ({type(err).__name__}: {err}). Use a template that supports tools."
        ) from err
    missing = []
    if with_tools.count(_PROBE_NAME) <= without_tools.count(_PROBE_NAME):  # the call itself also names the tool
        missing.append("tools")
    if _PROBE_RESULT not in with_tools:
        missing.append("tool results")
    if missing:
        raise ValueError(
            f"The chat template of tokenizer {label!r} does not render {' or '.join(missing)} (transformers ignores "
            "`tools=` for templates that do not use them), so the model would never see them. Use a tokenizer whose "
            "chat template supports tools (e.g. Qwen2.5/Qwen3 instruct) or set tokenizer.chat_template."
        )
