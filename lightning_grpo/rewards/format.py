"""Format reward: 1.0 when a completion follows a pattern such as ``<think>...</think> <answer>...</answer>``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lightning_grpo.rewards._text import completion_text

__all__ = ["DEFAULT_PATTERN", "FormatReward", "format_reward"]

#: Reasoning in ``<think>`` tags, then the answer in ``<answer>`` tags (DeepSeek-R1's template); matched with DOTALL.
DEFAULT_PATTERN = r"<think>.*?</think>\s*<answer>.*?</answer>"


class FormatReward:
    """1.0 for each completion that matches ``pattern``, else 0.0.

    Args:
        pattern: A regular expression, compiled with ``re.DOTALL`` so ``.`` spans lines.
        full_match: ``True``: the whole completion, surrounding whitespace stripped, must match. ``False``: a
            match anywhere in the completion is enough.

    Raises:
        ValueError: If ``pattern`` is not a valid regular expression.

    Example::

        >>> reward = FormatReward()
        >>> reward(["2+2="], ["<think>2 and 2</think>\\n<answer>4</answer>"])
        [1.0]
        >>> reward(["2+2="], ["4"])
        [0.0]
        >>> FormatReward(r"\\d+", full_match=False)(["", ""], ["it is 4", "four"])
        [1.0, 0.0]
    """

    #: The name :class:`~lightning_grpo.rewards.RewardFunctions` reports this reward under.
    name = "format_reward"

    def __init__(self, pattern: str = DEFAULT_PATTERN, *, full_match: bool = True) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a regular expression string; got {type(pattern).__name__} {pattern!r}")
        try:
            self._regex = re.compile(pattern, re.DOTALL)
        except re.error as err:
            raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {err}") from err
        self.pattern = pattern
        self.full_match = bool(full_match)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pattern={self.pattern!r}, full_match={self.full_match})"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Score each completion.

        Args:
            prompts: The prompts (unused).
            completions: The completions to check (strings, or message lists: the last assistant message counts).
            **kwargs: Dataset columns and extras (unused).

        Returns:
            1.0 or 0.0 per completion.
        """
        texts = [completion_text(completion) for completion in completions]  # conversational: last assistant turn
        if self.full_match:
            return [float(self._regex.fullmatch(text.strip()) is not None) for text in texts]
        return [float(self._regex.search(text) is not None) for text in texts]


#: A ready-made :class:`FormatReward` with the default pattern, reported as ``format_reward``.
format_reward = FormatReward()
