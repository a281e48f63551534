"""Group reward statistics: how much learning signal each GRPO iteration carries."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from typing_extensions import override

from lightning_grpo.algorithms.advantages import group_stats
from lightning_grpo.callbacks._outputs import check_prefix, num_prompts, step_output
from lightning_grpo.rewards import RewardScores

__all__ = ["GroupRewardStats", "group_reward_stats"]

SumAcrossRanks = Callable[[Tensor], Tensor]


class GroupRewardStats(Callback):
    r"""Log the reward and advantage statistics of each GRPO iteration, over the global batch.

    Metrics, each under ``prefix``:

    * ``group/reward_mean``, ``group/reward_std``: mean and unbiased std of the rewards of the batch.
    * ``group/within_var``: mean over groups of the unbiased within-group reward variance (groups with at least two
      valid rewards). GRPO learns only from this variance.
    * ``group/zero_var_frac``: fraction of groups whose valid rewards are all equal (or that have fewer than two):
      their advantages are 0, so they carry no learning signal. Near 1 means the task is too easy or too hard.
    * ``group/adv_mean``, ``group/adv_std``: mean and unbiased std of the advantages over valid rows (over valid
      tokens for token-level advantages).
    * ``reward/<name>``: mean raw value of each reward function over the rows it applied to.

    Rows that every reward function skipped (NaN reward) are left out of every statistic. The statistics are exact
    over the global batch: sums and counts are summed across ranks in one all-reduce (a mean of per-rank means would
    be biased when ranks hold different numbers of valid rows, and NaN when a reward function applies to no row of
    one rank), so the values are logged already reduced. A statistic without data (no valid row) is NaN.

    Args:
        prefix: Prepended to every metric name.

    Raises:
        TypeError: If ``prefix`` is not a string.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import GroupRewardStats
        >>> group_stats = GroupRewardStats(prefix="train/")
        >>> trainer = Trainer(callbacks=[group_stats], logger=False)
    """

    def __init__(self, prefix: str = "train/") -> None:
        self.prefix = check_prefix(prefix)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = step_output(outputs, self, ("rollout", "rewards", "advantages"))
        rollout = step["rollout"]
        reduce = lambda tensor: trainer.strategy.reduce(tensor, reduce_op="sum")  # noqa: E731
        stats = group_reward_stats(
            step["rewards"], rollout.group_ids, step["advantages"], rollout.completion_mask, reduce
        )
        metrics = {self.prefix + name: value for name, value in stats.items()}
        # Already reduced across ranks (see the class docstring): sync_dist would only average equal values.
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=num_prompts(rollout, pl_module))


def group_reward_stats(
    scores: RewardScores,
    group_ids: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    sum_across_ranks: SumAcrossRanks | None = None,
) -> dict[str, Tensor]:
    """The metrics of :class:`GroupRewardStats` (names without prefix), as float32 0-dim tensors.

    Args:
        scores: Combined ``(N,)`` rewards (NaN where skipped) and raw rewards per function.
        group_ids: ``(N,)`` the group of each row.
        advantages: ``(N,)`` or ``(N, T)``.
        completion_mask: ``(N, T)``, the valid tokens of token-level advantages.
        sum_across_ranks: Sums a tensor over ranks (e.g. an all-reduce); ``None`` for one process.

    Example::

        >>> scores = RewardScores(torch.tensor([1.0, 1.0, 0.0, 1.0]), {"f": torch.tensor([1.0, 1.0, 0.0, 1.0])})
        >>> stats = group_reward_stats(scores, torch.tensor([0, 0, 1, 1]), torch.zeros(4), torch.ones(4, 3))
        >>> stats["group/zero_var_frac"]  # group 0 = (1, 1) is constant, group 1 = (0, 1) is not
        tensor(0.5000)
        >>> stats["group/within_var"]  # mean of var(1, 1) = 0 and var(0, 1) = 0.5
        tensor(0.2500)
    """
    rewards = scores.rewards
    valid = ~torch.isnan(rewards)  # (N,)
    per_function = [(name, values, ~torch.isnan(values)) for name, values in scores.per_function.items()]
    sums = torch.cat(
        [
            _moments(rewards, valid),  # 0-2
            _group_sums(rewards, group_ids),  # 3-6
            _moments(advantages, _weights(advantages, valid, completion_mask)),  # 7-9
            *[_moments(values, applied)[:2] for _, values, applied in per_function],  # 10-: (count, sum) per function
        ]
    )
    if sum_across_ranks is not None:
        sums = sum_across_ranks(sums)
    stats = _from_sums(sums[:10])
    for (name, _, _), (count, total) in zip(per_function, sums[10:].view(-1, 2), strict=True):
        stats[f"reward/{name}"] = _ratio(total, count)
    return {name: value.float() for name, value in stats.items()}


def _from_sums(sums: Tensor) -> dict[str, Tensor]:
    """The batch and group statistics from the (global) sums and counts."""
    n, s, s2, groups, zero_var, var_groups, var_sum, n_adv, a, a2 = sums.unbind()
    return {
        "group/reward_mean": _ratio(s, n),
        "group/reward_std": _std(s, s2, n),
        "group/within_var": _ratio(var_sum, var_groups),
        "group/zero_var_frac": _ratio(zero_var, groups),
        "group/adv_mean": _ratio(a, n_adv),
        "group/adv_std": _std(a, a2, n_adv),
    }


def _weights(advantages: Tensor, valid: Tensor, completion_mask: Tensor) -> Tensor:
    """Which advantages count: valid rows, and for ``(N, T)`` advantages their valid tokens."""
    if advantages.dim() == 1:
        return valid
    return completion_mask.bool() & valid[:, None]  # (N, T)


def _moments(values: Tensor, weights: Tensor) -> Tensor:
    """``[count, sum, sum of squares]`` of ``values`` where ``weights``, in float64 (NaN outside is ignored)."""
    x = torch.where(weights, values.double(), torch.zeros((), dtype=torch.float64, device=values.device))
    return torch.stack([weights.double().sum(), x.sum(), (x * x).sum()])


def _group_sums(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``[groups, constant groups, groups with >= 2 valid rewards, sum of their unbiased variances]``."""
    stats = group_stats(rewards, group_ids)  # per-row views of the row's group, float64
    _, inverse, sizes = torch.unique(group_ids, return_inverse=True, return_counts=True)
    share = 1.0 / sizes[inverse].double()  # (N,) each group's rows add up to 1
    spread = stats.count > 1
    variance = torch.where(spread, stats.std**2, torch.zeros_like(stats.std))
    return torch.stack([share.sum(), (share * stats.constant).sum(), (share * spread).sum(), (share * variance).sum()])


def _ratio(numerator: Tensor, count: Tensor) -> Tensor:
    return torch.where(count > 0, numerator / count.clamp(min=1), torch.full_like(numerator, math.nan))


def _std(total: Tensor, squares: Tensor, count: Tensor) -> Tensor:
    """Unbiased std from the sum and the sum of squares; NaN for fewer than two values."""
    variance = (squares - total * total / count.clamp(min=1)) / (count - 1).clamp(min=1)
    return torch.where(count > 1, variance.clamp(min=0).sqrt(), torch.full_like(total, math.nan))
