"""FormatReward: the default think/answer pattern, full versus partial matching, validation, and naming."""

from __future__ import annotations

import pytest

from lightning_grpo.rewards import DEFAULT_PATTERN, FormatReward, RewardFunctions, format_reward


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>2 and 2</think><answer>4</answer>", 1.0),
        ("<think>\nline one\nline two\n</think>\n\n<answer>\n4\n</answer>", 1.0),  # DOTALL: tags span lines
        ("  <think>x</think> <answer>4</answer>\n", 1.0),  # surrounding whitespace is stripped
        ("<answer>4</answer>", 0.0),  # no reasoning
        ("<think>x</think>", 0.0),  # no answer
        ("<answer>4</answer><think>x</think>", 0.0),  # wrong order
        ("<think>x</think><answer>4</answer> and more", 0.0),  # text after the answer
        ("Sure! <think>x</think><answer>4</answer>", 0.0),  # text before the reasoning
        ("<think>x</think>oops<answer>4</answer>", 0.0),  # only whitespace may separate the blocks
        ("", 0.0),
    ],
)
def test_default_pattern_full_match(completion, expected):
    assert format_reward(["prompt"], [completion]) == [expected]


def test_partial_match_accepts_surrounding_text():
    reward = FormatReward(full_match=False)
    completions = ["Sure! <think>x</think><answer>4</answer> done", "<answer>4</answer>"]
    assert reward(["p", "p"], completions) == [1.0, 0.0]


def test_custom_pattern():
    reward = FormatReward(r"\\boxed\{.+\}", full_match=False)
    assert reward(["p", "p"], [r"so \boxed{4}.", "so 4."]) == [1.0, 0.0]


def test_invalid_pattern_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"pattern '<think>\(' is not a valid regular expression"):
        FormatReward("<think>(")


def test_non_string_pattern_is_refused():
    with pytest.raises(TypeError, match="pattern must be a regular expression string; got int 3"):
        FormatReward(3)  # type: ignore[arg-type]


def test_registered_name_is_format_reward_and_repeats_get_suffixes():
    assert RewardFunctions([format_reward, FormatReward("x")]).names == ("format_reward", "format_reward_1")


def test_default_instance_and_repr():
    assert format_reward.pattern == DEFAULT_PATTERN and format_reward.full_match is True
    assert repr(FormatReward("a", full_match=False)) == "FormatReward(pattern='a', full_match=False)"
