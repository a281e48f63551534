"""The types every advantage estimator shares: the group statistics it receives, its settings, what it declares it
needs (:func:`declare_needs`), and the batch moments (global over ranks) the whitening estimators use.

Re-exported by :mod:`~lightning_grpo.algorithms.advantages`; the estimators live there and in
:mod:`~lightning_grpo.algorithms.advantage_estimators`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import SumAcrossRanks, mean_std, moments

__all__ = [
    "AdvantageFunction",
    "AdvantageScale",
    "AdvantageSettings",
    "EstimatorNeeds",
    "GroupStats",
    "batch_moments",
    "declare_needs",
    "group_stats",
]

AdvantageScale = Literal["group", "batch", "none"]
F = TypeVar("F", bound=Callable[..., object])


@dataclass(frozen=True)
class GroupStats:
    """Per-sample views of its group's statistics over valid (non-NaN) rewards, each ``(N,)`` float64."""

    rewards: Tensor  # (N,) NaN replaced by 0
    valid: Tensor  # (N,) bool
    count: Tensor  # (N,) valid members of the sample's group
    mean: Tensor  # (N,) group mean
    total: Tensor  # (N,) group sum
    std: Tensor  # (N,) unbiased group std (0 when fewer than 2 valid members)
    constant: Tensor  # (N,) bool: every valid reward of the group is equal (no learning signal)
    group_ids: Tensor | None = None  # (N,) the group of each sample, as given


def _group_reduce(values: Tensor, inverse: Tensor, num_groups: int, reduce: str, fill: float) -> Tensor:
    out = torch.full((num_groups,), fill, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, inverse, values, reduce=reduce, include_self=False)


def group_stats(rewards: Tensor, group_ids: Tensor) -> GroupStats:
    """Mean, sum, count, unbiased std and constancy of each sample's group, ignoring NaN rewards."""
    valid = ~torch.isnan(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).double()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, valid.double())
    total = torch.zeros_like(count).index_add_(0, inverse, r)
    mean = total / count.clamp(min=1)
    sq_dev = torch.where(valid, (r - mean[inverse]) ** 2, torch.zeros_like(r))
    var = torch.zeros_like(count).index_add_(0, inverse, sq_dev) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.zeros_like(var))
    high = _group_reduce(torch.where(valid, r, -torch.inf), inverse, num_groups, "amax", -torch.inf)
    low = _group_reduce(torch.where(valid, r, torch.inf), inverse, num_groups, "amin", torch.inf)
    constant = (high <= low)[inverse]
    return GroupStats(r, valid, count[inverse], mean[inverse], total[inverse], std[inverse], constant, group_ids)


def batch_moments(values: Tensor, weights: Tensor, sum_across_ranks: SumAcrossRanks | None) -> tuple[Tensor, Tensor]:
    """Weighted mean and unbiased std of ``values`` over the global batch (across ranks if asked); 0 if undefined."""
    sums = moments(values, weights)
    mean, std = mean_std(*(sums if sum_across_ranks is None else sum_across_ranks(sums)).unbind())
    return mean.nan_to_num(0.0), std.nan_to_num(0.0)


@dataclass(frozen=True)
class AdvantageSettings:
    """The settings every advantage estimator receives (each uses those it needs).

    Attributes:
        scale: For ``grpo``: ``"group"`` (divide by the group std), ``"batch"`` (by the batch std) or ``"none"``.
        eps: Added to the std before dividing.
        sum_across_ranks: Sums a tensor over data-parallel ranks, for batch-level statistics; ``None``: one process.
        step_rewards: For process estimators: ``(N, T)`` the reward of each step at the token where it ends, NaN
            elsewhere; ``None`` when nothing gave step rewards.
        function_rewards: For estimators that declare ``function_rewards``: each reward function's ``(N,)`` raw
            (unweighted) rewards, NaN where it returned ``None``; ``None`` when not given.
        function_weights: The weight of each reward function of ``function_rewards`` (``reward_weights``).
    """

    scale: AdvantageScale = "group"
    eps: float = 1e-6
    sum_across_ranks: SumAcrossRanks | None = None
    step_rewards: Tensor | None = None
    function_rewards: Mapping[str, Tensor] | None = None
    function_weights: Mapping[str, float] | None = None


#: ``(stats, completion_mask, settings) -> advantages``: ``(N,)``, or ``(N, T)`` zero on padding.
AdvantageFunction = Callable[[GroupStats, Tensor | None, AdvantageSettings], Tensor]


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an advantage estimator needs beyond the rewards, as its function declares it (:func:`declare_needs`).

    Attributes:
        groups: Compares a sample with its group (``needs_groups``): ``num_generations >= 2`` is required.
        step_rewards: Reads ``settings.step_rewards`` (``needs_step_rewards``): the module gathers the step rewards
            of reward functions and environments for it, and refuses a run where nothing gives them.
        function_rewards: Reads ``settings.function_rewards`` (``needs_function_rewards``): each reward function's
            own rewards and weight; it needs two reward functions or more and no agent trajectories.
    """

    groups: bool = False
    step_rewards: bool = False
    function_rewards: bool = False


def declare_needs(
    *, groups: bool = False, step_rewards: bool = False, function_rewards: bool = False
) -> Callable[[F], F]:
    """Mark an advantage estimator with what it needs (the attributes ``needs_groups``, ``needs_step_rewards``,
    ``needs_function_rewards``).

    Example::

        >>> @declare_needs(groups=True, step_rewards=True)
        ... def my_estimator(stats, completion_mask, settings):
        ...     return settings.step_rewards.nan_to_num(0.0)
        >>> from lightning_grpo.algorithms import estimator_needs
        >>> estimator_needs(my_estimator)
        EstimatorNeeds(groups=True, step_rewards=True, function_rewards=False)
    """

    def mark(function: F) -> F:
        setattr(function, "needs_groups", groups)  # noqa: B010 - an attribute of a function, typed as one
        setattr(function, "needs_step_rewards", step_rewards)  # noqa: B010
        setattr(function, "needs_function_rewards", function_rewards)  # noqa: B010
        return function

    return mark
