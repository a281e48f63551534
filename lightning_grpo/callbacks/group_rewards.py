"""Group reward statistics: how much learning signal each GRPO iteration carries."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from typing_extensions import override

from lightning_grpo.algorithms.advantage_estimators import gdpo_metrics
from lightning_grpo.algorithms.advantages import AdvantageSettings, estimator_needs, group_stats
from lightning_grpo.algorithms.statistics import SumAcrossRanks, mean_std, moments, ratio
from lightning_grpo.callbacks._arguments import check_prefix
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.rewards import RewardScores

__all__ = ["GroupRewardStats", "group_reward_stats", "process_stats"]


class GroupRewardStats(Callback):
    r"""Log the reward and advantage statistics of each GRPO iteration, over the global batch.

    Metrics, each under ``prefix``:

    * ``reward_mean``, ``reward_std``: mean and unbiased std of the rewards of the batch.
    * ``group/within_var``: mean over groups of the unbiased within-group reward variance (groups with at least two
      valid rewards). GRPO learns only from this variance.
    * ``group/adv_mean``, ``group/adv_std``: mean and unbiased std of the advantages over valid rows (over valid
      tokens for token-level advantages).
    * ``reward/<name>``: mean raw value of each reward function over the rows it applied to.
    * ``process/steps_mean``, ``process/step_reward_mean``, ``process/no_step_frac``: with ``grpo_process`` only,
      steps per completion, mean (weighted) step reward, and fraction of completions without any step reward
      (their advantages are 0), over the step rewards the estimator reads.
    * ``gdpo/<name>/share``, ``gdpo/<name>/zero_std_frac``: with ``gdpo`` (an estimator that reads each reward
      function's rewards) only, each function's share of the summed group-normalised advantage and the fraction of
      its groups in which it is constant.

    The fraction of groups without learning signal is ``train/zero_std_frac``, which ``GRPOModule`` logs itself.
    Rows that every reward function skipped (NaN reward) are left out of every statistic. The statistics are exact
    over the global batch: counts, sums and sums of squares are summed across ranks in one reduction
    (:mod:`lightning_grpo.metrics`; a mean of per-rank means would be biased when ranks hold different numbers of
    valid rows, and NaN when a reward function applies to no row of one rank). A statistic without data is NaN.

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
        stats = group_reward_stats(
            step["rewards"], rollout.group_ids, step["advantages"], rollout.sampled_mask, reduce_across_ranks
        )
        stats.update(per_function_stats(pl_module, step["rewards"], rollout.group_ids))
        pl_module.log_dict({self.prefix + name: value for name, value in stats.items()})  # already global


def per_function_stats(pl_module: LightningModule, scores: RewardScores, group_ids: Tensor) -> dict[str, Tensor]:
    """``gdpo/<name>/share`` and ``gdpo/<name>/zero_std_frac`` when the module's estimator reads each reward
    function's rewards (``gdpo``; :func:`~lightning_grpo.algorithms.advantage_estimators.gdpo_metrics`), else none."""
    config, rewards = getattr(pl_module, "config", None), getattr(pl_module, "rewards", None)
    if config is None or rewards is None or not estimator_needs(config.advantages.advantage_estimator).function_rewards:
        return {}
    settings = AdvantageSettings(
        eps=config.advantages.advantage_eps,
        sum_across_ranks=reduce_across_ranks,
        function_rewards=scores.per_function,
        function_weights=dict(zip(rewards.names, rewards.weights, strict=True)),
    )
    metrics = gdpo_metrics(group_stats(scores.rewards, group_ids), settings)
    return {name: value.float() for name, value in metrics.items()}


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
        completion_mask: ``(N, T)``, the tokens of token-level advantages (the module passes ``Rollout.sampled_mask``).
        sum_across_ranks: Sums a tensor over ranks (e.g. an all-reduce); ``None`` for one process.

    Example::

        >>> scores = RewardScores(torch.tensor([1.0, 1.0, 0.0, 1.0]), {"f": torch.tensor([1.0, 1.0, 0.0, 1.0])})
        >>> stats = group_reward_stats(scores, torch.tensor([0, 0, 1, 1]), torch.zeros(4), torch.ones(4, 3))
        >>> stats["reward_mean"], stats["reward_std"]
        (tensor(0.7500), tensor(0.5000))
        >>> stats["group/within_var"]  # mean of var(1, 1) = 0 and var(0, 1) = 0.5
        tensor(0.2500)
    """
    rewards = scores.rewards
    valid = ~torch.isnan(rewards)  # (N,)
    per_function = [(name, values, ~torch.isnan(values)) for name, values in scores.per_function.items()]
    sums = torch.cat(
        [
            moments(rewards, valid),  # 0-2
            _group_sums(rewards, group_ids),  # 3-4
            moments(advantages, _weights(advantages, valid, completion_mask)),  # 5-7
            *[moments(values, applied)[:2] for _, values, applied in per_function],  # 8-: (count, sum) per function
        ]
    )
    if sum_across_ranks is not None:
        sums = sum_across_ranks(sums)
    reward_mean, reward_std = mean_std(*sums[:3])
    adv_mean, adv_std = mean_std(*sums[5:8])
    stats = {
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "group/within_var": ratio(sums[4], sums[3]),  # mean of the variances of groups with a spread
        "group/adv_mean": adv_mean,
        "group/adv_std": adv_std,
    }
    for (name, _, _), (count, total) in zip(per_function, sums[8:].view(-1, 2), strict=True):
        stats[f"reward/{name}"] = ratio(total, count)
    if scores.step_rewards is not None:
        stats.update(process_stats(scores.step_rewards, sum_across_ranks))
    return {name: value.float() for name, value in stats.items()}


def process_stats(step_rewards: Tensor, sum_across_ranks: SumAcrossRanks | None = None) -> dict[str, Tensor]:
    """Steps per completion, mean step reward and fraction of completions without a step, over the global batch.

    Example::

        >>> nan = float("nan")
        >>> stats = process_stats(torch.tensor([[1.0, nan, 3.0], [nan, nan, nan]]))
        >>> stats["process/steps_mean"], stats["process/step_reward_mean"], stats["process/no_step_frac"]
        (tensor(1., dtype=torch.float64), tensor(2., dtype=torch.float64), tensor(0.5000, dtype=torch.float64))
    """
    ends = ~torch.isnan(step_rewards)  # (N, T)
    steps = ends.sum(1)  # (N,)
    total = torch.where(ends, step_rewards, 0.0).double().sum()
    rows = torch.full((), len(steps), dtype=torch.float64, device=step_rewards.device)
    sums = torch.stack([rows, steps.sum().double(), total, (steps == 0).sum().double()])  # on the rewards' device
    rows, count, total, none = sums if sum_across_ranks is None else sum_across_ranks(sums)
    return {
        "process/steps_mean": ratio(count, rows),
        "process/step_reward_mean": ratio(total, count),
        "process/no_step_frac": ratio(none, rows),
    }


def _weights(advantages: Tensor, valid: Tensor, completion_mask: Tensor) -> Tensor:
    """Which advantages count: valid rows, and for ``(N, T)`` advantages their valid tokens."""
    if advantages.dim() == 1:
        return valid
    return completion_mask.bool() & valid[:, None]  # (N, T)


def _group_sums(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``[groups with >= 2 valid rewards, sum of their unbiased variances]``, each group counted once."""
    stats = group_stats(rewards, group_ids)  # per-row views of the row's group, float64
    _, inverse, sizes = torch.unique(group_ids, return_inverse=True, return_counts=True)
    share = 1.0 / sizes[inverse].double()  # (N,) each group's rows add up to 1
    spread = stats.count > 1
    variance = torch.where(spread, stats.std**2, torch.zeros_like(stats.std))
    return torch.stack([(share * spread).sum(), (share * variance).sum()])
