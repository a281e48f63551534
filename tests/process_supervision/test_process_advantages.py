"""Process advantages (DeepSeekMath §4.1.3): worked examples by hand, properties, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.algorithms.process_supervision import process_advantages, with_outcome_step

NAN = math.nan


def _steps() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two groups of two rows, T = 5.

    Group 0: row 0 has steps ending at tokens 1 (reward 1) and 3 (reward 0); row 1 one step at token 2 (reward 2) and
    4 tokens. Group 1: rows 2 and 3 one step each at token 0, both reward 5 (no spread).
    """
    steps = torch.tensor(
        [
            [NAN, 1.0, NAN, 0.0, NAN],
            [NAN, NAN, 2.0, NAN, NAN],
            [5.0, NAN, NAN, NAN, NAN],
            [5.0, NAN, NAN, NAN, NAN],
        ]
    )
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    return steps, torch.tensor([0, 0, 1, 1]), mask


def test_worked_example_group_std():
    steps, groups, mask = _steps()
    got = process_advantages(steps, groups, mask, eps=0.0)
    # Group 0: R = {1, 0, 2}, mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1, so r~ = 0 (token 1), -1 (token 3), 1.
    # Row 0: tokens 0-1 see both steps: 0 + (-1) = -1; tokens 2-3 the second: -1; token 4 is after the last step: 0.
    # Row 1: tokens 0-2 see its one step: 1; token 3 is after it: 0; token 4 is masked: 0.
    # Group 1: R = {5, 5}, no spread: every advantage 0.
    expected = torch.tensor([[-1.0, -1.0, -1.0, -1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0], [0.0] * 5, [0.0] * 5])
    torch.testing.assert_close(got, expected)


def test_worked_example_batch_std_and_none():
    steps, groups, mask = _steps()
    # Batch: every step reward {1, 0, 2, 5, 5}: mean 2.6, squared deviations 2.56, 6.76, 0.36, 5.76, 5.76 sum to
    # 21.2, unbiased variance 21.2 / 4 = 5.3. Group 0 is centred by its own mean (1) and divided by sqrt(5.3).
    s = math.sqrt(5.3)
    got = process_advantages(steps, groups, mask, scale="batch", eps=0.0)
    expected = torch.tensor([[-1 / s] * 4 + [0.0], [1 / s] * 3 + [0.0, 0.0], [0.0] * 5, [0.0] * 5])
    torch.testing.assert_close(got, expected)
    # "none" (Dr. GRPO): centred only, r - mean_g: 0, -1, 1 as above without a division.
    got = process_advantages(steps, groups, mask, scale="none")
    torch.testing.assert_close(got, torch.tensor([[-1.0] * 4 + [0.0], [1.0] * 3 + [0.0, 0.0], [0.0] * 5, [0.0] * 5]))


def test_masked_tokens_between_turns_stay_zero():
    # A two-turn row: tokens 2-3 were inserted by the environment (masked). Its turns end at tokens 1 (reward 1) and
    # 5 (reward 0); the other row of the group has one turn ending at token 1 (reward 0).
    steps = torch.tensor([[NAN, 1.0, NAN, NAN, NAN, 0.0], [NAN, 0.0, NAN, NAN, NAN, NAN]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]])
    got = process_advantages(steps, torch.tensor([7, 7]), mask, eps=0.0)
    # R = {1, 0, 0}: mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3), so r~ = (2/3)/sqrt(1/3) = 2c for
    # the first turn and -c for each zero, with c = (1/3)/sqrt(1/3) = sqrt(1/3).
    c = math.sqrt(1 / 3)
    # Row 0: first-turn tokens see both steps: 2c - c = c; inserted tokens 0; second-turn tokens -c.
    expected = torch.tensor([[c, c, 0.0, 0.0, -c, -c], [-c, -c, 0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(got, expected)


def test_outcome_only_reproduces_outcome_grpo():
    # No step rewards, the outcome as a step at each row's last token: every token gets the row's outcome advantage.
    rewards = torch.tensor([1.0, 0.0, 0.5, 3.0, NAN, 2.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    steps = with_outcome_step(torch.full(mask.shape, NAN), rewards, mask, 1.0)
    got = compute_advantages(rewards, groups, estimator="grpo_process", completion_mask=mask, step_rewards=steps)
    outcome = compute_advantages(rewards, groups)[:, None] * mask
    torch.testing.assert_close(got, outcome)


def test_outcome_step_sums_with_a_step_ending_on_the_last_token():
    steps = torch.tensor([[NAN, 1.0, 2.0], [NAN, NAN, NAN]])
    got = with_outcome_step(steps, torch.tensor([10.0, NAN]), torch.tensor([[1, 1, 1], [1, 1, 0]]), 0.5)
    # Row 0: 2 + 0.5 * 10 = 7 at its last token; row 1's outcome is NaN: no step.
    torch.testing.assert_close(got, torch.tensor([[NAN, 1.0, 7.0], [NAN, NAN, NAN]]), equal_nan=True)
    assert with_outcome_step(steps, torch.tensor([1.0, 1.0]), torch.ones(2, 3), 0.0) is steps


@pytest.mark.parametrize("scale", ["group", "none", "batch"])
def test_group_sums_of_first_token_advantages_are_zero(scale):
    # Token 0 precedes every step, so it gets the sum of its row's normalised step rewards; these are centred per
    # group, so their sum over a group is 0 (when every row has tokens from 0 on).
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 9, generator=generator)
    ends = torch.rand(6, 9, generator=generator) < 0.4
    steps = torch.where(ends, rewards, NAN)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    got = process_advantages(steps, groups, torch.ones(6, 9), scale=scale)
    sums = torch.zeros(2).index_add_(0, groups, got[:, 0])
    torch.testing.assert_close(sums, torch.zeros(2), atol=1e-5, rtol=0)


def test_invariant_to_affine_maps_of_the_step_rewards():
    steps, groups, mask = _steps()
    steps[3, 0] = 4.0  # give group 1 a spread
    base = process_advantages(steps, groups, mask)
    torch.testing.assert_close(process_advantages(3.0 * steps - 7.0, groups, mask), base, atol=1e-5, rtol=1e-5)


def test_rows_without_steps_get_zero_and_groups_need_not_be_contiguous():
    steps = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, NAN], [NAN, 3.0]])
    got = process_advantages(steps, torch.tensor([4, 9, 4, 9]), torch.ones(4, 2), eps=0.0)
    # Group 4: R = {1, 0}, mean 0.5, std sqrt(0.5): r~ = +-0.5/sqrt(0.5) = +-sqrt(0.5) at token 0. Group 9 has one
    # step (row 3): no spread, 0; row 1 has none.
    h = math.sqrt(0.5)
    torch.testing.assert_close(got, torch.tensor([[h, 0.0], [0.0, 0.0], [-h, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize(
    ("steps", "mask", "message"),
    [
        ([[math.inf, NAN]], [[1, 1]], "is not finite"),
        ([[NAN, 1.0]], [[1, 0]], "ends outside the completion"),
        ([[1.0]], [[1, 1]], "must be \\(N, T\\)"),
    ],
)
def test_bad_step_rewards_are_refused(steps, mask, message):
    with pytest.raises(ValueError, match=message):
        process_advantages(torch.tensor(steps), torch.tensor([0]), torch.tensor(mask))


def test_grpo_process_without_step_rewards_is_refused():
    with pytest.raises(ValueError, match="grpo_process needs step_rewards"):
        compute_advantages(torch.ones(2), torch.zeros(2), estimator="grpo_process", completion_mask=torch.ones(2, 3))
