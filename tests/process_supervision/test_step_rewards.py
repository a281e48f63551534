"""StepRewards: the form reward functions return for process supervision, and how RewardFunctions takes it."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.rewards import RewardError, RewardFunctions, StepRewards, gives_step_rewards, step_reward


def test_split_keeps_each_separator_with_the_step_before_it():
    text = "a=1\nb=2\nc"
    steps = StepRewards.split(text, [1.0, 0.5, -1.0])
    assert steps.ends == (4, 8, 9)  # "a=1\n", "b=2\n", "c"
    assert [text[s:e] for s, e in zip((0, *steps.ends), steps.ends, strict=False)] == ["a=1\n", "b=2\n", "c"]
    assert StepRewards.split("x||y||", [1, 2], separator="||").ends == (3, 6)
    assert steps.total == 0.5


@pytest.mark.parametrize(
    ("rewards", "ends", "message"),
    [
        ([1.0], [3, 5], "one end per reward"),
        ([1.0, math.nan], [3, 5], "finite numbers"),
        ([math.inf], [3], "finite numbers"),
        ([1.0, 2.0], [5, 5], "strictly increasing"),
        ([1.0, 2.0], [5, 3], "strictly increasing"),
        ([1.0], [0], "strictly increasing"),
        ([1.0], [2.5], "integer character offsets"),
        (["1"], [2], "finite numbers"),
    ],
)
def test_bad_steps_are_refused(rewards, ends, message):
    with pytest.raises(ValueError, match=message):
        StepRewards(rewards, ends)


def test_split_needs_one_reward_per_step():
    with pytest.raises(ValueError, match="2 steps cut at '\\\\n'; got 1 rewards"):
        StepRewards.split("a\nb", [1.0])


def test_ends_beyond_the_text_are_named():
    with pytest.raises(ValueError, match="row 3: step ends \\[2, 9\\] lie outside the completion's 4 characters"):
        StepRewards([1, 1], [2, 9]).check_within(4, "row 3")


def test_reward_functions_count_steps_as_their_sum_and_keep_them():
    @step_reward
    def lines(completions, **_):
        count = lambda c: c.count("\n") + (not c.endswith("\n"))  # noqa: E731 (steps of c)
        return [StepRewards.split(c, [1.0] * count(c)) if "\n" in c else None for c in completions]

    def length(completions, **_):
        return [float(len(c)) for c in completions]

    assert gives_step_rewards(lines) and not gives_step_rewards(length)
    scores = RewardFunctions([lines, length], weights=[2.0, 0.5])(["p"] * 3, ["a\nb\n", "c", "d\ne"])
    # Row 0: 2 * (1 + 1) + 0.5 * 4 = 6; row 1: lines skipped, 0.5 * 1; row 2 ("d\n", "e"): 2 * (1 + 1) + 0.5 * 3.
    torch.testing.assert_close(scores.rewards, torch.tensor([6.0, 0.5, 5.5]))
    torch.testing.assert_close(scores.per_function["lines"], torch.tensor([2.0, math.nan, 2.0]), equal_nan=True)
    assert scores.steps["lines"][0] == StepRewards([1.0, 1.0], [2, 4]) and scores.steps["lines"][1] is None
    assert "length" not in scores.steps


def test_other_values_are_still_refused_with_step_rewards_named():
    with pytest.raises(RewardError, match="expected a float, int, bool, StepRewards or None"):
        RewardFunctions([lambda completions, **_: [(1.0, 2)]])(["p"], ["c"])
