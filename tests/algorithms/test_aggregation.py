"""Worked examples for ``aggregate_loss`` in every mode.

Shared batch ``L`` (N=3, T=3) with mask ``M``:

    L = [[1, 2, 3],         M = [[1, 1, 1],      row 0: 3 tokens, sum 6, mean 2
         [4, nan, inf],          [1, 0, 0],      row 1: 1 token,  sum 4, mean 4 (NaN/inf on padding)
         [5, 6, 7]]              [0, 0, 0]]      row 2: fully masked

Valid tokens 4, token sum 10, sequences with a valid token 2.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import LOSS_AGG_MODES, aggregate_loss, count_sequences

INF, NAN = math.inf, math.nan


def _batch(requires_grad=False):
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, INF], [5.0, 6.0, 7.0]], requires_grad=requires_grad)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    return values, mask


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 4),  # (1 + 2 + 3 + 4) / 4 = 2.5
        ("token-sum", 10.0),  # 1 + 2 + 3 + 4
        ("seq-mean-token-mean", 3.0),  # (6/3 + 4/1) / 2 = (2 + 4) / 2; the empty row is not a sequence
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", 10 / 6),  # 10 / (2 sequences * norm T=3) = 1.6667
    ],
)
def test_modes_default_counts(mode, expected):
    values, mask = _batch()
    out = aggregate_loss(values, mask, mode)
    assert out.ndim == 0
    assert_close(out, torch.tensor(expected))  # finite: the NaN/inf on padding does not leak


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 8),  # sum 10 over the global token count 8 = 1.25
        ("token-sum", 10.0),  # counts do not enter
        ("seq-mean-token-mean", 6 / 4),  # (2 + 4) / global 4 sequences = 1.5
        ("seq-mean-token-sum", 10 / 4),  # (6 + 4) / 4 = 2.5
        ("seq-mean-token-sum-norm", 10 / 20),  # 10 / (4 sequences * norm 5) = 0.5
    ],
)
def test_modes_global_counts(mode, expected):
    values, mask = _batch()
    out = aggregate_loss(values, mask, mode, num_tokens=8, num_sequences=4, norm=5)
    assert_close(out, torch.tensor(expected))


def test_global_counts_as_tensors():
    # all-reduced counts arrive as tensors: 10 / 8 = 1.25; (2 + 4) / 4 = 1.5
    values, mask = _batch()
    assert_close(aggregate_loss(values, mask, num_tokens=torch.tensor(8)), torch.tensor(1.25))
    out = aggregate_loss(values, mask, "seq-mean-token-mean", num_sequences=torch.tensor(4.0))
    assert_close(out, torch.tensor(1.5))


def test_norm_argument():
    # seq-mean-token-sum-norm with norm 10 (e.g. max_new_tokens): 10 / (2 * 10) = 0.5
    values, mask = _batch()
    assert_close(aggregate_loss(values, mask, "seq-mean-token-sum-norm", norm=10), torch.tensor(0.5))
    # norm 2.5 (a float): 10 / (2 * 2.5) = 2
    assert_close(aggregate_loss(values, mask, "seq-mean-token-sum-norm", norm=2.5), torch.tensor(2.0))


@pytest.mark.parametrize(
    ("mode", "expected_grad"),
    [
        # d/dL of sum(L M) / 4 = M / 4
        ("token-mean", [[0.25, 0.25, 0.25], [0.25, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        ("token-sum", [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        # row 0: 1 / (3 tokens * 2 seqs) = 1/6; row 1: 1 / (1 * 2) = 0.5
        ("seq-mean-token-mean", [[1 / 6, 1 / 6, 1 / 6], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        # 1 / 2 sequences
        ("seq-mean-token-sum", [[0.5, 0.5, 0.5], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        # 1 / (2 * 3)
        ("seq-mean-token-sum-norm", [[1 / 6, 1 / 6, 1 / 6], [1 / 6, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ],
)
def test_gradients_are_zero_on_padding_even_with_nan(mode, expected_grad):
    values, mask = _batch(requires_grad=True)
    aggregate_loss(values, mask, mode).backward()
    assert_close(values.grad, torch.tensor(expected_grad))  # no NaN from the padded NaN/inf


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_empty_mask_gives_zero_not_nan(mode):
    # no valid token: 0 / clamp(0, min=1) = 0 in every mode, even if every value is NaN
    values = torch.full((2, 3), NAN, requires_grad=True)
    mask = torch.zeros(2, 3)
    out = aggregate_loss(values, mask, mode)
    assert_close(out, torch.tensor(0.0))
    out.backward()
    assert_close(values.grad, torch.zeros(2, 3))


def test_fully_masked_row_does_not_dilute_sequence_means():
    # rows: [2, 2] (mean 2, sum 4) and a fully masked row of 100s.
    # seq-mean-token-mean: 2 / 1 sequence = 2 (not 2 / 2 = 1); seq-mean-token-sum: 4 / 1 = 4
    values = torch.tensor([[2.0, 2.0], [100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert_close(aggregate_loss(values, mask, "seq-mean-token-mean"), torch.tensor(2.0))
    assert_close(aggregate_loss(values, mask, "seq-mean-token-sum"), torch.tensor(4.0))
    assert_close(count_sequences(mask), torch.tensor(1))


def test_docstring_example_and_bool_mask():
    # token-mean (1 + 3 + 2) / 3 = 2; seq-mean-token-mean ((1 + 3) / 2 + 2 / 1) / 2 = 2
    values = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    for mask in (torch.tensor([[1, 1], [1, 0]]), torch.tensor([[True, True], [True, False]])):
        assert_close(aggregate_loss(values, mask, "token-mean"), torch.tensor(2.0))
        assert_close(aggregate_loss(values, mask, "seq-mean-token-mean"), torch.tensor(2.0))


def test_default_mode_is_token_mean_and_dtype_preserved():
    # bf16 loss: (1 + 3 + 2) / 3 = 2, returned in bf16
    values = torch.tensor([[1.0, 3.0], [2.0, -INF]], dtype=torch.bfloat16)
    out = aggregate_loss(values, torch.tensor([[1, 1], [1, 0]]))
    assert out.dtype == torch.bfloat16
    assert_close(out, torch.tensor(2.0, dtype=torch.bfloat16))


def test_micro_batch_shares_add_up_with_global_count():
    # whole batch token-mean: (1 + 2 + 3 + 4) / 4 = 2.5; split rows {0} and {1, 2} with num_tokens=4:
    # 6 / 4 + 4 / 4 = 1.5 + 1.0 = 2.5
    values, mask = _batch()
    first = aggregate_loss(values[:1], mask[:1], num_tokens=4)
    second = aggregate_loss(values[1:], mask[1:], num_tokens=4)
    assert_close(first, torch.tensor(1.5))
    assert_close(first + second, torch.tensor(2.5))
