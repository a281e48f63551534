"""The one place chat messages become tokens: prompts through the chat template, and the tokens a tool or environment
turn inserts into a running trajectory (see ``docs/agents.md``).

Inserted tokens are the difference between two renderings of the same conversation, before and after the new
messages, so the tokens the policy sampled are never re-tokenized: a trajectory's ids stay those of the sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.sampling_settings import eos_token_ids

__all__ = ["continuation_ids", "render_messages"]


def render_messages(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The text of ``messages`` under the tokenizer's chat template (with the tool schemas when given).

    Raises:
        ValueError: The tokenizer has no chat template.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"tokenizer {name!r} has no chat template, so conversational prompts cannot be rendered; set "
            "tokenizer.chat_template or use string prompts"
        )
    return tokenizer.apply_chat_template(
        list(messages), tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False
    )


def continuation_ids(
    tokenizer: PreTrainedTokenizerBase,
    history: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Tokens that follow the policy's last turn (which ended with an EOS token) when ``new_messages`` are added.

    The template's text after the last EOS of ``history`` (e.g. the newline after ``<|im_end|>``), the new messages,
    and the header of the next assistant turn, tokenized on their own.

    Args:
        tokenizer: The policy's tokenizer.
        history: The conversation so far, ending with the assistant turn the policy just sampled.
        new_messages: Tool or environment messages to insert.
        tools: Tool schemas rendered into the conversation.

    Raises:
        ValueError: The template renders ``history`` differently once messages are added (it is not prefix-stable),
            so inserted tokens cannot be computed.
    """
    before = render_messages(tokenizer, history, tools=tools, add_generation_prompt=False)
    after = render_messages(tokenizer, [*history, *new_messages], tools=tools, add_generation_prompt=True)
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders the earlier turns differently once tool/environment messages are added, so "
            "the tokens to insert cannot be computed without re-tokenizing the conversation; use a template whose "
            "rendering of a conversation is a prefix of its rendering with more messages"
        )
    tail = before[_end_of_last_eos(tokenizer, before) :]
    return tokenizer(tail + after[len(before) :], add_special_tokens=False)["input_ids"]


def _end_of_last_eos(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    """Index just past the last end-of-turn token's text in ``text`` (``len(text)`` when there is none)."""
    markers = [m for m in tokenizer.convert_ids_to_tokens(eos_token_ids(tokenizer).tolist()) if m]
    ends = [text.rfind(m) + len(m) for m in markers if m in text]
    return max(ends) if ends else len(text)
