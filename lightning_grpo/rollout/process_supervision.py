"""Process supervision in the rollout layer: step rewards as token positions, reward functions' character offsets
and environment turns, in one ``(N, T)``.

Process supervision has one file per layer, each named ``process_supervision.py`` (the same feature in four
layers): ``algorithms`` (the advantages), ``rewards`` (:class:`~lightning_grpo.rewards.StepRewards`, the process reward
model), ``rollout`` (step ends as token positions) and ``iteration`` (gathering the step rewards of one GRPO iteration).


For ``grpo_process`` (``docs/math.md``, "Process supervision") every step ends at a token of the completion:

* a reward function's :class:`~lightning_grpo.rewards.StepRewards` step ending at character offset ``c`` ends at the
  first token whose decoded prefix of the completion covers the first ``c`` characters: the token that completes
  the step's last character (a token that spans a boundary ends the step before it). The decoding is the rollout's
  own (``tokenizer.decode(ids, skip_special_tokens=True)``), never a re-tokenisation of the text, so multi-byte
  characters split over several tokens and tokens merging several characters map exactly.
* an environment's turn reward ends at the last token of the policy turn it judged (``TurnStats.turn_ends``).

Steps of several sources that end on the same token are one step whose reward is the sum of their weighted rewards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents.environment import turn_reward_problem
from lightning_grpo.rewards.process_supervision import StepRewards
from lightning_grpo.rollout.batch import Rollout

__all__ = ["completion_step_text", "step_rewards_tensor", "token_ends"]


def _covered(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], k: int, text: str) -> int:
    """How many leading characters of ``text`` the decoding of the first ``k + 1`` tokens reproduces."""
    decoded = tokenizer.decode(list(ids[: k + 1]), skip_special_tokens=True)
    n = min(len(decoded), len(text))
    mismatch = next((i for i in range(n) if decoded[i] != text[i]), n)
    return mismatch


def token_ends(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], text: str, ends: Sequence[int]) -> list[int]:
    """The token index at which each step ending at a character offset of ``text`` ends.

    Args:
        tokenizer: The policy's tokenizer (the one that sampled ``ids``).
        ids: The completion's tokens, padding removed.
        text: The completion's text as the rollout decoded it from ``ids``.
        ends: Character offsets into ``text`` (exclusive ends of the steps), increasing.

    Returns:
        For each offset ``c``, the smallest ``k`` such that decoding ``ids[:k + 1]`` reproduces ``text[:c]``.

    Raises:
        ValueError: An offset lies outside ``1..len(text)``, or decoding ``ids`` does not reproduce ``text``.

    Example::

        >>> from lightning_grpo.testing import build_tiny_tokenizer
        >>> tokenizer = build_tiny_tokenizer()  # one token per character
        >>> token_ends(tokenizer, tokenizer("ab\\ncd")["input_ids"] + [tokenizer.eos_token_id], "ab\\ncd", [3, 5])
        [2, 4]
    """
    if ends and not 0 < ends[0] <= ends[-1] <= len(text):
        raise ValueError(f"step ends {list(ends)} lie outside the completion's {len(text)} characters")
    if ends and _covered(tokenizer, ids, len(ids) - 1, text) < ends[-1]:
        raise ValueError("decoding the completion's tokens does not reproduce its text; cannot place its steps")
    positions, low = [], 0
    for end in ends:
        high = len(ids) - 1
        while low < high:  # the first k whose decoded prefix covers `end` characters (covered grows with k)
            middle = (low + high) // 2
            low, high = (middle + 1, high) if _covered(tokenizer, ids, middle, text) < end else (low, middle)
        if (low > 0 and _covered(tokenizer, ids, low - 1, text) >= end) or _covered(tokenizer, ids, low, text) < end:
            raise ValueError(f"cannot place the step end at character {end}: the decoded prefixes do not grow")
        positions.append(low)
    return positions


def completion_step_text(completion: Any) -> str:
    """The text step offsets refer to: a string completion, or the content of a single assistant message.

    Raises:
        ValueError: A multi-turn completion (several messages), whose steps are the environment's turns.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and len(completion) == 1 and isinstance(completion[0], dict):
        return str(completion[0].get("content") or "")
    raise ValueError(
        "StepRewards apply to single-turn completions (character offsets into its text); in a multi-turn rollout "
        "the environment's turn rewards are the steps (EnvStep.reward)"
    )


def _add(out: Tensor, row: int, position: int, reward: float) -> None:
    current = float(out[row, position])
    out[row, position] = reward if math.isnan(current) else current + reward


def step_rewards_tensor(
    tokenizer: PreTrainedTokenizerBase,
    rollout: Rollout,
    steps: Mapping[str, Sequence[StepRewards | None]],
    weights: Mapping[str, float],
) -> Tensor:
    """``(N, T)`` the weighted reward of each step at the token where it ends, NaN elsewhere.

    Args:
        tokenizer: The policy's tokenizer.
        rollout: The rollout scored (its environment turn rewards, if any, become steps of weight 1).
        steps: Reward name to the :class:`~lightning_grpo.rewards.StepRewards` of each row (``None``: none).
        weights: Reward name to its weight.

    Raises:
        ValueError: Step ends outside a completion, step rewards on a multi-turn completion, or a turn reward that is
            not finite; the row is named.
    """
    out = torch.full(rollout.completion_ids.shape, math.nan, dtype=torch.float32, device="cpu")  # built on the host
    ids = rollout.completion_token_ids
    for name, rows in steps.items():
        for row, value in enumerate(rows):
            if value is None:
                continue
            where = f"reward function {name!r}, row {row}"
            try:
                text = completion_step_text(rollout.completions[row])
                value.check_within(len(text), where)
                positions = token_ends(tokenizer, ids[row], text, value.ends)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
            for position, reward in zip(positions, value.rewards, strict=True):
                _add(out, row, position, weights[name] * reward)
    if rollout.turns is not None:
        for row, (rewards, ends) in enumerate(zip(rollout.turns.turn_rewards, rollout.turns.turn_ends, strict=True)):
            for turn, (reward, end) in enumerate(zip(rewards, ends, strict=True)):
                problem = turn_reward_problem(reward)
                if problem:
                    raise ValueError(f"row {row}, turn {turn}: the environment's {problem}")
                if reward is not None:
                    _add(out, row, end, float(reward))
    return out.to(rollout.completion_ids.device)
