"""Step rewards from a reward function: :class:`StepRewards`, with step boundaries as character offsets.

A reward function for process supervision (``advantage_estimator: grpo_process``, ``docs/math.md``) returns, for a
completion, a :class:`StepRewards` instead of a number: one reward per step and where each step ends, as a character
offset into the completion's text, so no one writes token arithmetic. The module turns the offsets into token
positions once, exactly (:mod:`lightning_grpo.rollout.steps`). Mark such a function with :func:`step_reward` so that
fitting can check, before the first step, that ``grpo_process`` has step rewards to work with.

Under an outcome estimator (``grpo``, ``rloo``, ...) a :class:`StepRewards` counts as the sum of its step rewards.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["StepRewards", "gives_step_rewards", "step_reward"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class StepRewards:
    """The step rewards of one completion: step ``k`` is ``text[ends[k-1]:ends[k]]`` and earns ``rewards[k]``.

    Args:
        rewards: One finite reward per step.
        ends: Where each step ends, as character offsets into the completion text (exclusive), strictly increasing,
            each in ``1..len(text)``; the first step starts at 0. Text after the last end belongs to no step (its
            tokens get advantage 0 unless an outcome reward is added, ``GRPOConfig.process_outcome_weight``).

    Raises:
        ValueError: Lengths differ, an end is not an integer, the ends do not increase, or a reward is not finite.

    Example::

        >>> text = "2+3=5\\n5*2=10\\n"
        >>> StepRewards([1.0, 0.0], [6, 13]) == StepRewards.split(text, [1.0, 0.0])  # "2+3=5\\n", "5*2=10\\n"
        True
    """

    rewards: tuple[float, ...]
    ends: tuple[int, ...]

    def __init__(self, rewards: Sequence[float], ends: Sequence[int]) -> None:
        rewards, ends = tuple(rewards), tuple(ends)
        if len(rewards) != len(ends):
            raise ValueError(f"StepRewards needs one end per reward; got {len(rewards)} rewards and {len(ends)} ends")
        for reward in rewards:
            if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
                raise ValueError(f"step rewards must be finite numbers; got {reward!r} in {list(rewards)}")
        for end in ends:
            if isinstance(end, bool) or not isinstance(end, numbers.Integral):
                raise ValueError(f"step ends must be integer character offsets; got {end!r} in {list(ends)}")
        if any(b <= a for a, b in zip((0, *ends), ends, strict=False)):
            raise ValueError(f"step ends must be strictly increasing character offsets >= 1; got {list(ends)}")
        object.__setattr__(self, "rewards", tuple(float(r) for r in rewards))
        object.__setattr__(self, "ends", tuple(int(e) for e in ends))

    @classmethod
    def split(cls, text: str, rewards: Sequence[float], separator: str = "\n") -> StepRewards:
        """Steps of ``text`` cut after each ``separator`` (kept with the step before it), one reward per step.

        Text after the last separator is one more step when it is not empty. ``rewards`` must have one entry per step.

        Raises:
            ValueError: The number of rewards is not the number of steps, or ``separator`` is empty.
        """
        if not separator:
            raise ValueError("separator must be a non-empty string")
        ends, start = [], 0
        while (found := text.find(separator, start)) >= 0:
            start = found + len(separator)
            ends.append(start)
        if start < len(text):
            ends.append(len(text))
        if len(rewards) != len(ends):
            raise ValueError(f"the text has {len(ends)} steps cut at {separator!r}; got {len(rewards)} rewards")
        return cls(rewards, ends)

    @property
    def total(self) -> float:
        """The sum of the step rewards: the value of the completion under an outcome estimator."""
        return math.fsum(self.rewards)

    def check_within(self, length: int, where: str) -> None:
        """Raise a ``ValueError`` naming ``where`` when the last end lies beyond a text of ``length`` characters."""
        if self.ends and self.ends[-1] > length:
            raise ValueError(f"{where}: step ends {list(self.ends)} lie outside the completion's {length} characters")


def step_reward(function: F) -> F:
    """Mark a reward function that returns :class:`StepRewards`, so ``grpo_process`` knows at fit start it has steps.

    Example::

        >>> @step_reward
        ... def each_line(completions, **kwargs):
        ...     return [StepRewards.split(c, [1.0] * c.count("\\n")) for c in completions]
        >>> gives_step_rewards(each_line)
        True
    """
    function.gives_step_rewards = True  # type: ignore[attr-defined]
    return function


def gives_step_rewards(function: Any) -> bool:
    """Whether a reward function is marked as returning :class:`StepRewards` (:func:`step_reward`)."""
    return getattr(function, "gives_step_rewards", False) is True
