"""Masked means and moment statistics, shared by the algorithm core, the module and the metrics.

Means and standard deviations over several ranks are computed from sums (count, sum, sum of squares) so that a sum
over ranks of the per-rank sums gives the exact global value; :mod:`lightning_grpo.metrics` reduces them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["SumAcrossRanks", "masked_mean", "mean_std", "moments", "ratio", "sequence_fraction"]

#: Sums a tensor over data-parallel ranks (an all-reduce); the identity in one process.
SumAcrossRanks = Callable[[Tensor], Tensor]


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is true; 0 when the mask is empty.

    Example::

        >>> masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))
        tensor(2.)
    """
    valid = mask.bool()
    return torch.where(valid, values, torch.zeros_like(values)).sum() / valid.sum().clamp(min=1)


def moments(values: Tensor, weights: Tensor) -> Tensor:
    """``[count, sum, sum of squares]`` of ``values`` weighted by ``weights`` (bool or float), in float64.

    Values outside the weights (weight 0 or ``False``) are ignored, NaN included.
    """
    w = weights.double()
    x = torch.where(w != 0, values.double(), torch.zeros((), dtype=torch.float64, device=values.device))
    return torch.stack([w.sum(), (x * w).sum(), (x * x * w).sum()])


def ratio(total: Tensor, count: Tensor) -> Tensor:
    """``total / count``; NaN where ``count`` is 0 (a mean of nothing)."""
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, math.nan))


def mean_std(count: Tensor, total: Tensor, squares: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std from :func:`moments`; NaN where undefined (no value; fewer than two for the std).

    Example::

        >>> mean_std(*moments(torch.tensor([1.0, 2.0, 3.0, float("nan")]), torch.tensor([1, 1, 1, 0])))
        (tensor(2., dtype=torch.float64), tensor(1., dtype=torch.float64))
    """
    mean = ratio(total, count)
    variance = (squares - total * total / count.clamp(min=1)) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, variance.clamp(min=0).sqrt(), torch.full_like(total, math.nan))
    return mean, std


def sequence_fraction(hit: Tensor, mask: Tensor) -> Tensor:
    """``(2,)``: ``[sequences with a hit on one of their tokens, sequences with tokens]`` (a ``*_seq_frac`` metric).

    Example::

        >>> hit = torch.tensor([[True, False], [False, False], [True, True]])
        >>> sequence_fraction(hit, torch.tensor([[1, 1], [1, 0], [0, 0]]))  # row 2 has no tokens
        tensor([1., 2.])
    """
    mask = mask.bool()
    rows = mask.any(-1)
    return torch.stack([(hit.expand_as(mask) & mask).any(-1).sum(), rows.sum()]).float()
