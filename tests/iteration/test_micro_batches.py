"""Token-budget micro-batches: within the budget, balanced, the same count on every rank (issue 36, item 2)."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import GRPOConfig
from lightning_grpo.config import SamplingConfig, UpdateConfig
from lightning_grpo.iteration.micro_batches import micro_batch_rows, row_tokens, split_by_tokens
from tests.rollout.packing_cases import mixed_rollout

LENGTHS = [9, 7, 14, 5, 6, 8, 13, 14, 40, 3, 3, 21]


@pytest.mark.parametrize(("budget", "max_rows"), [(40, None), (45, None), (64, 3), (200, None), (200, 2)])
def test_each_row_once_within_the_budget_and_balanced(budget, max_rows):
    groups = split_by_tokens(LENGTHS, budget, max_rows)
    assert sorted(row for group in groups for row in group) == list(range(len(LENGTHS)))
    loads = [sum(LENGTHS[row] for row in group) for group in groups]
    assert max(loads) <= budget and all(len(group) <= (max_rows or 99) for group in groups)
    assert len(groups) >= -(-sum(LENGTHS) // budget)
    if max_rows is None:  # longest-first to the least loaded: no micro-batch mostly empty
        assert min(loads) >= max(loads) - max(LENGTHS), loads


def test_a_budget_below_the_longest_sequence_names_both_numbers_and_the_fix():
    with pytest.raises(
        ValueError, match=r"micro_batch_tokens=30 is smaller than the longest sequence.*\(40 tokens.*at least 40"
    ):
        split_by_tokens(LENGTHS, 30)


def _other_rank(count: int):
    """A sum across two ranks in which the other rank voted for ``count`` micro-batches."""

    def sums(votes: torch.Tensor) -> torch.Tensor:
        other = torch.zeros_like(votes)
        other[count] = 1.0
        return votes + other

    return sums


def test_ranks_agree_on_the_largest_count(tokenizer):
    rollout = mixed_rollout(len(tokenizer), [3, 5], [[4, 9, 2], [12, 1, 6]])
    lengths = row_tokens(rollout)
    own = micro_batch_rows(rollout, None, 20, lambda votes: votes, torch.device("cpu"))
    assert len(own) == len(split_by_tokens(lengths, 20))
    for other in (len(own) + 1, len(rollout)):  # more micro-batches on the other rank: split finer, or run empties
        agreed = micro_batch_rows(rollout, None, 20, _other_rank(other), torch.device("cpu"))
        assert len(agreed) == other
        assert sorted(torch.cat(agreed).tolist()) == list(range(len(rollout)))
        assert all(sum(lengths[r] for r in rows.tolist()) <= 20 for rows in agreed)
    fewer = micro_batch_rows(rollout, None, 20, _other_rank(1), torch.device("cpu"))
    assert len(fewer) == len(own)


def test_without_a_budget_rows_split_by_count(tokenizer):
    rollout = mixed_rollout(len(tokenizer), [3, 5], [[4, 9, 2], [12, 1, 6]])
    chunks = micro_batch_rows(rollout, 4, None, None, torch.device("cpu"))
    assert [c.tolist() for c in chunks] == [[0, 1, 2, 3], [4, 5]]


def test_rollout_size_rule_for_budgets():
    config = GRPOConfig(
        sampling=SamplingConfig(num_generations=4),
        update=UpdateConfig(mini_batch_size=8, micro_batch_size=3, micro_batch_tokens=512),
    )
    config.check_rollout_size(16)  # micro_batch_size only caps the rows of a micro-batch: it need not divide
    with pytest.raises(
        ValueError, match=r"12 completions.*multiple of update\.mini_batch_size=8 .*update\.micro_batch_tokens=512"
    ):
        GRPOConfig(
            sampling=SamplingConfig(num_generations=4), update=UpdateConfig(mini_batch_size=8, micro_batch_tokens=512)
        ).check_rollout_size(12)
    with pytest.raises(ValueError, match=r"micro_batch_tokens must be an integer >= 1 or None, got 0"):
        GRPOConfig(update=UpdateConfig(micro_batch_tokens=0))
    with pytest.raises(ValueError, match=r"packing='yes' is not valid; choose one of 'auto', True, False"):
        GRPOConfig(update=UpdateConfig(packing="yes"))
