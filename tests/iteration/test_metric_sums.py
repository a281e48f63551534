"""``MetricSums``: token-weighted means, maxima, minima and sequence fractions of the update loop's metrics."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.metrics import MetricSums


def _two_micro_batches() -> MetricSums:
    sums = MetricSums()
    sums.add({"kl": torch.tensor(1.0), "w_max": torch.tensor(2.0), "w_min": torch.tensor(0.5),
              "x_seq_frac": torch.tensor([1.0, 4.0])}, torch.tensor(3.0))  # fmt: skip
    sums.add({"kl": torch.tensor(5.0), "w_max": torch.tensor(1.5), "w_min": torch.tensor(0.25),
              "x_seq_frac": torch.tensor([2.0, 2.0])}, torch.tensor(1.0))  # fmt: skip
    return sums


def test_means_maxima_minima_and_sequence_fractions():
    means = _two_micro_batches().means()
    assert means["kl"].item() == pytest.approx((3 * 1 + 5) / 4)  # token-weighted
    assert means["w_max"].item() == 2.0 and means["w_min"].item() == 0.25
    assert means["x_seq_frac"].item() == pytest.approx(3 / 6)  # sequences, not tokens: (1 + 2) / (4 + 2)


def test_across_ranks_each_reduction_is_its_own():
    """With ``sum_across_ranks`` the sums go through it, the extrema through a max/min reduction (one process:
    the identity), so a minimum is never summed."""
    doubled = _two_micro_batches().means(lambda t: 2 * t)  # as if a second rank had the same values
    assert doubled["kl"].item() == pytest.approx(2.0) and doubled["x_seq_frac"].item() == pytest.approx(0.5)
    assert doubled["w_min"].item() == 0.25 and doubled["w_max"].item() == 2.0
