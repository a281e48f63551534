"""OverlongPenalty: DAPO eq. 13 at and around its boundaries, validation, and the completion_lengths keyword."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lightning_grpo.rewards import OverlongPenalty, RewardError, RewardFunctions, soft_overlong_penalty


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (79, 0.0),
        (80, 0.0),  # L = max - buffer: last length without penalty
        (81, -0.05),  # (80 - 81) / 20
        (90, -0.5),  # (80 - 90) / 20
        (99, -0.95),  # (80 - 99) / 20
        (100, -1.0),  # L = max: (80 - 100) / 20, meets the flat part exactly
        (101, -1.0),  # past the limit
        (10_000, -1.0),
    ],
)
def test_boundaries_max_100_buffer_20(length, expected):
    assert soft_overlong_penalty(length, max_length=100, buffer_length=20) == pytest.approx(expected)
    reward = OverlongPenalty(max_length=100, buffer_length=20)
    assert reward(["p"], ["c"], completion_lengths=[length]) == [pytest.approx(expected)]


def test_penalty_scales_every_branch():
    reward = OverlongPenalty(max_length=100, buffer_length=20, penalty=2.0)
    # 80 -> 0; 90 -> (80 - 90) / 20 * 2 = -1; 200 -> -2
    assert reward(["", "", ""], ["", "", ""], completion_lengths=[80, 90, 200]) == [0.0, -1.0, -2.0]


def test_buffer_equal_to_max_ramps_from_zero_length():
    reward = OverlongPenalty(max_length=10, buffer_length=10)
    # 0 -> 0; 1 -> (0 - 1) / 10; 5 -> -0.5; 10 -> -1; 11 -> -1
    got = reward([""] * 5, [""] * 5, completion_lengths=[0, 1, 5, 10, 11])
    assert got == pytest.approx([0.0, -0.1, -0.5, -1.0, -1.0])


def test_lengths_may_be_a_tensor():
    reward = OverlongPenalty(max_length=100, buffer_length=20)
    assert reward(["", ""], ["", ""], completion_lengths=torch.tensor([90, 120])) == [-0.5, -1.0]


def test_through_reward_functions_with_completion_lengths():
    reward_fns = RewardFunctions([OverlongPenalty(max_length=100, buffer_length=20)], weights=[0.5])
    assert reward_fns.names == ("overlong_penalty",)
    scores = reward_fns(["a", "b"], ["x", "y"], {"answer": ["1", "2"]}, completion_lengths=[50, 90])
    # raw [0, -0.5], weighted by 0.5 -> [0, -0.25]
    assert scores.per_function["overlong_penalty"].tolist() == [0.0, -0.5]
    assert scores.rewards.tolist() == [0.0, -0.25]


def test_missing_completion_lengths_is_an_error_that_explains_the_keyword():
    reward_fns = RewardFunctions([OverlongPenalty(max_length=100, buffer_length=20)])
    with pytest.raises(
        RewardError, match="'overlong_penalty' raised RewardError: overlong_penalty needs completion_lengths"
    ):
        reward_fns(["a"], ["x"])


def test_completion_lengths_of_wrong_length():
    with pytest.raises(RewardError, match=r"one entry per completion \(2\); got 1"):
        OverlongPenalty(max_length=100, buffer_length=20)(["a", "b"], ["x", "y"], completion_lengths=[3])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_length": 100, "buffer_length": 0}, r"0 < buffer_length <= max_length \(= 100\); got 0"),
        ({"max_length": 100, "buffer_length": -5}, r"0 < buffer_length <= max_length \(= 100\); got -5"),
        ({"max_length": 100, "buffer_length": 101}, r"0 < buffer_length <= max_length \(= 100\); got 101"),
        ({"max_length": 100.0, "buffer_length": 10}, "max_length must be an integer, got 100.0"),
        ({"max_length": 100, "buffer_length": True}, "buffer_length must be an integer, got True"),
        ({"max_length": 100, "buffer_length": 10, "penalty": -1.0}, "penalty must be a finite number >= 0.0, got -1.0"),
        ({"max_length": 100, "buffer_length": 10, "penalty": float("inf")}, "finite number >= 0.0, got inf"),
        ({"max_length": 100, "buffer_length": 10, "penalty": float("nan")}, "finite number >= 0.0, got nan"),
    ],
)
def test_invalid_arguments_name_the_allowed_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OverlongPenalty(**kwargs)


def test_repr():
    assert repr(OverlongPenalty(100, 20, 0.5)) == "OverlongPenalty(max_length=100, buffer_length=20, penalty=0.5)"


@given(st.integers(1, 500), st.integers(0, 1000), st.integers(0, 1000))
def test_penalty_is_bounded_and_non_increasing_in_length(buffer_length, a, b):
    max_length = 500
    low, high = sorted((a, b))
    p_low = soft_overlong_penalty(low, max_length=max_length, buffer_length=buffer_length)
    p_high = soft_overlong_penalty(high, max_length=max_length, buffer_length=buffer_length)
    assert -1.0 <= p_high <= p_low <= 0.0
