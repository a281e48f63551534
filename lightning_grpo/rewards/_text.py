"""Text of prompts and completions in either form: strings, or lists of chat messages (conversational data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DATASET_INDEX", "completion_text", "excerpt"]

_EXCERPT_CHARS = 80
#: The column :class:`~lightning_grpo.data.PromptDataModule` adds: each row's index in its data, so that errors about
#: a row (a reward function's, an environment's) name the dataset row rather than the batch row.
DATASET_INDEX = "dataset_index"


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text a reward reads from one completion: the string itself, or the last assistant message's content.

    Args:
        completion: A string (string prompts), or the list of chat messages the rollout added (conversational
            prompts: assistant turns, tool and environment turns).

    Returns:
        The text; ``""`` for a conversation without an assistant message with content.

    Raises:
        TypeError: If ``completion`` is neither a string nor a list of message dicts.

    Example::

        >>> completion_text("42")
        '42'
        >>> completion_text([{"role": "assistant", "content": "call"}, {"role": "tool", "content": "7"},
        ...                  {"role": "assistant", "content": "It is 7."}])
        'It is 7.'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and all(isinstance(message, Mapping) for message in completion):
        for message in reversed(completion):
            if message.get("role") == "assistant" and isinstance(message.get("content"), str):
                return message["content"]
        return ""
    raise TypeError(
        f"a completion must be a string or a list of chat messages (dicts); got {type(completion).__name__} "
        f"{completion!r:.80}"
    )


def excerpt(value: object) -> str:
    """A short ``repr`` of a prompt or completion for error messages: a message list shows its last content."""
    if isinstance(value, Sequence) and not isinstance(value, str) and value and isinstance(value[-1], Mapping):
        value = f"[... {value[-1].get('role')}: {value[-1].get('content')}]"
    text = str(value)
    return repr(text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "...")
