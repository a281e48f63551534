"""DAPO's soft overlong punishment: a length penalty that ramps up over a buffer before the length limit.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", eq. 13
(https://arxiv.org/abs/2503.14476). With ``L_max`` the maximum length, ``L_cache`` the buffer and ``|y|`` the
completion length in tokens::

    R_length(y) = 0                                 if |y| <= L_max - L_cache
                  ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                  -1                                if L_max < |y|

scaled here by ``penalty``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_grpo.rewards.reward_functions import RewardError
from lightning_grpo.settings_checks import check_number

__all__ = ["OverlongPenalty", "soft_overlong_penalty"]


def soft_overlong_penalty(length: int, *, max_length: int, buffer_length: int, penalty: float = 1.0) -> float:
    """DAPO eq. 13 for one completion: 0, then a linear ramp down to ``-penalty`` over the buffer, then ``-penalty``.

    Args:
        length: Completion length in tokens.
        max_length: ``L_max``; longer completions get ``-penalty``.
        buffer_length: ``L_cache``; the ramp covers lengths ``(max_length - buffer_length, max_length]``.
        penalty: The largest punishment.
    """
    threshold = max_length - buffer_length
    if length <= threshold:
        return 0.0
    if length <= max_length:
        return (threshold - length) / buffer_length * penalty
    return -penalty


class OverlongPenalty:
    """DAPO's soft overlong punishment as a reward function; needs the ``completion_lengths`` keyword.

    Completion lengths are token counts, which text alone does not give: the caller passes them to
    :class:`~lightning_grpo.rewards.RewardFunctions` as ``completion_lengths=[...]``. Reported as ``overlong_penalty``.

    Args:
        max_length: ``L_max`` in tokens; longer completions get ``-penalty``.
        buffer_length: ``L_cache`` in tokens, ``0 < buffer_length <= max_length``; the penalty ramps linearly from 0
            at ``max_length - buffer_length`` to ``-penalty`` at ``max_length``.
        penalty: The largest punishment, ``>= 0``.

    Raises:
        ValueError: If a length or ``penalty`` is outside the allowed range.

    Example::

        >>> reward = OverlongPenalty(max_length=100, buffer_length=20)
        >>> # 80 tokens: at the threshold, 0; 90: halfway through the buffer, (80 - 90) / 20; 120: past the limit
        >>> reward(["", "", ""], ["a", "b", "c"], completion_lengths=[80, 90, 120])
        [0.0, -0.5, -1.0]
    """

    #: The name :class:`~lightning_grpo.rewards.RewardFunctions` reports this reward under.
    name = "overlong_penalty"

    def __init__(self, max_length: int, buffer_length: int, penalty: float = 1.0) -> None:
        for key, value in (("max_length", max_length), ("buffer_length", buffer_length)):
            check_number(key, value, integer=True)  # tokens
        if not 0 < buffer_length <= max_length:
            raise ValueError(
                f"buffer_length must satisfy 0 < buffer_length <= max_length (= {max_length}); got {buffer_length}"
            )
        check_number("penalty", penalty, minimum=0.0)
        self.max_length = int(max_length)
        self.buffer_length = int(buffer_length)
        self.penalty = float(penalty)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_length={self.max_length}, buffer_length={self.buffer_length}, "
            f"penalty={self.penalty:g})"
        )

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        completion_lengths: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """Penalise each completion by its token length.

        Args:
            prompts: The prompts (unused).
            completions: The completions (only their number is used).
            completion_lengths: Token count of each completion.
            **kwargs: Dataset columns and extras (unused).

        Returns:
            One value in ``[-penalty, 0]`` per completion.

        Raises:
            RewardError: If ``completion_lengths`` is missing or does not have one entry per completion.
        """
        if completion_lengths is None:
            raise RewardError(
                "overlong_penalty needs completion_lengths (token counts, one per completion): "
                "call RewardFunctions(...)(prompts, completions, columns, completion_lengths=[...])"
            )
        lengths = completion_lengths.tolist() if hasattr(completion_lengths, "tolist") else list(completion_lengths)
        if len(lengths) != len(completions):
            raise RewardError(
                f"completion_lengths must have one entry per completion ({len(completions)}); got {len(lengths)}"
            )
        return [
            soft_overlong_penalty(
                int(length), max_length=self.max_length, buffer_length=self.buffer_length, penalty=self.penalty
            )
            for length in lengths
        ]
