"""Outcome advantages: one scalar per sequence from its group's rewards.

Estimators (choose by name, see :data:`ADVANTAGE_ESTIMATORS`):

* ``grpo`` — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300) §4.1.2: ``(r - mean_g) / (std_g + eps)`` with the
  unbiased group std. ``scale="none"`` drops the std (Dr. GRPO, Liu et al., 2025, arXiv:2503.20783);
  ``scale="batch"`` divides by the std of the whole (global) batch (Liu et al., 2025, "Tricks or Traps",
  arXiv:2508.08221).
* ``rloo`` — REINFORCE leave-one-out (Ahmadian et al., 2024, arXiv:2402.14740): ``r - mean of the other G-1``.
* ``reinforce_pp_baseline`` — REINFORCE++ with group baseline (Hu, 2025, arXiv:2501.03262): ``r - mean_g``, then
  whitened over all valid tokens of the batch.
* ``grpo_process`` — DeepSeekMath §4.1.3, process supervision: the step rewards of a group normalised together, each
  token's advantage the sum of the normalised rewards of the steps ending at or after it
  (:mod:`~lightning_grpo.algorithms.process_supervision`).
* ``gdpo``, ``grpo_passk``, ``opo``, ``reinforce_plus_plus``, ``gpg`` — the 2025 estimators of
  :mod:`~lightning_grpo.algorithms.advantage_estimators` (GDPO normalises each reward function on its own).

Rewards that are NaN (every reward function skipped the row) are left out of every statistic and get advantage 0;
groups whose valid rewards are all equal get 0 (except under per-function estimators such as ``gdpo``). Groups are
located by ``group_ids`` and need not be contiguous; the statistics are vectorised with ``index_add_`` (no Python
loop over groups).

An estimator of your own is an :data:`AdvantageFunction` named by its import path (``advantage_estimator:
my_project.advantages.my_estimator``): it receives the rewards' :class:`GroupStats`, the completion mask and one
:class:`AdvantageSettings`. An estimator declares what it needs beyond the rewards with :func:`declare_needs`
(attributes ``needs_groups``, ``needs_step_rewards`` and ``needs_function_rewards`` on the function), never by its
name: the configuration reads them (:func:`estimator_needs`) to refuse ``num_generations < 2``, to gather step
rewards for it, and to give it each reward function's rewards.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms._checks import check_floating
from lightning_grpo.algorithms.advantage_estimators import NEW_ESTIMATORS
from lightning_grpo.algorithms.advantage_types import (
    AdvantageFunction,
    AdvantageScale,
    AdvantageSettings,
    EstimatorNeeds,
    GroupStats,
    batch_moments,
    declare_needs,
    group_stats,
)
from lightning_grpo.algorithms.catalogue import choose
from lightning_grpo.algorithms.components import ComponentRole, build_component
from lightning_grpo.algorithms.process_supervision import process_advantages
from lightning_grpo.algorithms.statistics import SumAcrossRanks

AdvantageEstimator = Literal[
    "grpo", "rloo", "reinforce_pp_baseline", "grpo_process", "gdpo", "grpo_passk", "opo", "reinforce_plus_plus", "gpg"
]

__all__ = [
    "ADVANTAGE_ESTIMATOR",
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageFunction",
    "AdvantageScale",
    "AdvantageSettings",
    "EstimatorNeeds",
    "GroupStats",
    "compute_advantages",
    "declare_needs",
    "estimator_needs",
    "group_stats",
]


def estimator_needs(estimator: str | AdvantageFunction) -> EstimatorNeeds:
    """What ``estimator`` (a built-in name, an import path, or the function) declares it needs; nothing if undeclared.

    Raises:
        ValueError: An unknown name, or an import path that does not import (listing the valid names).
        TypeError: A ``needs_groups``, ``needs_step_rewards`` or ``needs_function_rewards`` attribute that is not
            ``True`` or ``False``.
    """
    if callable(estimator):
        function = estimator
    else:
        function = choose(ADVANTAGE_ESTIMATORS, estimator, "advantage estimator", import_paths=True)
    needs = {}
    for field in ("groups", "step_rewards", "function_rewards"):
        value = getattr(function, f"needs_{field}", False)
        if not isinstance(value, bool):
            name = getattr(function, "__qualname__", repr(function))
            raise TypeError(
                f"the advantage estimator {name} sets needs_{field}={value!r}; it must be True or False "
                "(lightning_grpo.algorithms.declare_needs sets it)"
            )
        needs[field] = value
    return EstimatorNeeds(**needs)


# Every estimator shares one signature: AdvantageFunction; each declares what it needs.
@declare_needs(groups=True)
def _grpo(stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
    centred = stats.rewards - stats.mean  # (N,)
    if settings.scale == "group":
        return centred / (stats.std + settings.eps)
    if settings.scale == "batch":
        _, std_batch = batch_moments(stats.rewards, stats.valid.double(), settings.sum_across_ranks)
        return centred / (std_batch + settings.eps)
    return centred


@declare_needs(groups=True)
def _rloo(stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
    leave_one_out_mean = (stats.total - stats.rewards) / (stats.count - 1).clamp(min=1)
    return stats.rewards - leave_one_out_mean  # (N,)


@declare_needs(groups=True)
def _reinforce_pp_baseline(stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
    if completion_mask is None or completion_mask.ndim != 2 or completion_mask.shape[0] != stats.rewards.shape[0]:
        got = None if completion_mask is None else tuple(completion_mask.shape)
        n = stats.rewards.shape[0]
        raise ValueError(f"reinforce_pp_baseline needs completion_mask of shape (N, T) with N={n}; got {got}")
    keep = stats.valid & ~stats.constant
    tokens = torch.where(keep, stats.rewards - stats.mean, 0.0)[:, None].expand(completion_mask.shape)  # (N, T)
    weights = completion_mask.double() * stats.valid[:, None]
    mean, std = batch_moments(tokens, weights, settings.sum_across_ranks)
    return (tokens - mean) / (std + settings.eps) * weights * keep[:, None]  # constant groups, skipped rows stay 0


@declare_needs(groups=True, step_rewards=True)
def _grpo_process(stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
    if settings.step_rewards is None or completion_mask is None or stats.group_ids is None:
        raise ValueError(
            "grpo_process needs step_rewards (N, T), completion_mask (N, T) and group_ids: step rewards come from "
            "environment turn rewards or reward functions that return StepRewards (docs/math.md, Process supervision)"
        )
    return process_advantages(
        settings.step_rewards,
        stats.group_ids,
        completion_mask,
        scale=settings.scale,
        eps=settings.eps,
        sum_across_ranks=settings.sum_across_ranks,
    )


#: Read-only catalogue of the built-in estimators: name -> :data:`AdvantageFunction`; ``estimator`` may also be the
#: import path of such a function (:mod:`~lightning_grpo.algorithms.catalogue`).
ADVANTAGE_ESTIMATORS: Mapping[str, AdvantageFunction] = MappingProxyType(
    {
        "grpo": _grpo,
        "rloo": _rloo,
        "reinforce_pp_baseline": _reinforce_pp_baseline,
        "grpo_process": _grpo_process,
        **NEW_ESTIMATORS,
    }
)
#: The role of an advantage estimator: how a component named by ``advantage_estimator`` (with
#: ``advantage_estimator_args``) is built and called.
ADVANTAGE_ESTIMATOR = ComponentRole(
    "advantage estimator", ADVANTAGE_ESTIMATORS, ("stats", "completion_mask", "settings"), "Tensor"
)
_SCALES = MappingProxyType({"group": "group", "batch": "batch", "none": "none"})


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    estimator: AdvantageEstimator | str = "grpo",
    estimator_args: Mapping[str, Any] | None = None,
    scale: AdvantageScale = "group",
    eps: float = 1e-6,
    completion_mask: Tensor | None = None,
    sum_across_ranks: SumAcrossRanks | None = None,
    step_rewards: Tensor | None = None,
    function_rewards: Mapping[str, Tensor] | None = None,
    function_weights: Mapping[str, float] | None = None,
) -> Tensor:
    """Group-relative advantages, one per sequence (per token for ``reinforce_pp_baseline``, ``reinforce_plus_plus``).

    Args:
        rewards: ``(N,)`` float scalar reward per sample; NaN marks a row no reward function applied to.
        group_ids: ``(N,)`` integer group of each sample (samples of one prompt share an id; any order).
        estimator: A name of :data:`ADVANTAGE_ESTIMATORS` (``"grpo"``, ``"rloo"``, ``"reinforce_pp_baseline"``,
            ``"grpo_process"``, ``"gdpo"``, ``"grpo_passk"``, ``"opo"``, ``"reinforce_plus_plus"``, ``"gpg"``), or
            the import path of an :data:`AdvantageFunction` (or of a class whose instances are one).
        estimator_args: The estimator's own settings (its keyword-only parameters or its class's ``__init__``
            arguments): ``k`` for ``grpo_passk``, ``gamma`` for ``reinforce_plus_plus``, ``f_norm`` and ``alpha``
            for ``gpg``, ``whiten`` for ``gdpo``; the others take none.
        scale: For ``grpo``: ``"group"`` (divide by the group std), ``"batch"`` (by the batch std) or ``"none"``.
        eps: Added to the std before dividing.
        completion_mask: ``(N, T)`` valid-token mask; required by ``reinforce_pp_baseline``, ``reinforce_plus_plus``,
            ``opo``, ``grpo_process`` and ``gdpo`` with ``whiten="tokens"``.
        sum_across_ranks: Sums a tensor over data-parallel ranks (e.g. an all-reduce); makes ``scale="batch"`` and
            the REINFORCE++ whitening use global statistics. Groups never straddle ranks, so group statistics stay
            local.
        step_rewards: ``(N, T)`` the reward of each step at the token where it ends, NaN elsewhere; required by
            ``grpo_process`` (which reads no ``rewards``: add an outcome step with
            :func:`~lightning_grpo.algorithms.process_supervision.with_outcome_step`).
        function_rewards: Each reward function's ``(N,)`` raw rewards (NaN where it returned ``None``); required by
            ``gdpo`` (two functions or more).
        function_weights: Each reward function's weight (default 1), for ``gdpo``.

    Returns:
        ``(N,)`` advantages in ``rewards.dtype`` — ``(N, T)`` for ``reinforce_pp_baseline``, ``reinforce_plus_plus``
        and ``grpo_process``, zero on padding.

    Raises:
        ValueError: Unknown estimator or scale, shape mismatch, or a missing ``completion_mask``.

    Example::

        >>> r = torch.tensor([1.0, 0.0, 1.0, 1.0])
        >>> compute_advantages(r, torch.tensor([0, 0, 1, 1]))
        tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    estimate = build_component(ADVANTAGE_ESTIMATOR, estimator, estimator_args)
    choose(_SCALES, scale, "advantage scale")
    check_floating("rewards", rewards)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be (N,); got rewards {tuple(rewards.shape)}, "
            f"group_ids {tuple(group_ids.shape)}"
        )
    stats = group_stats(rewards, group_ids)
    settings = AdvantageSettings(scale, eps, sum_across_ranks, step_rewards, function_rewards, function_weights)
    advantages = estimate(stats, completion_mask, settings)
    if advantages.ndim == 1:  # token-level estimators zero their own invalid rows
        # per-function estimators find signal where the weighted sum is constant: they zero only the unscored rows
        per_function = estimator_needs(estimator).function_rewards
        advantages = torch.where(stats.valid & (per_function | ~stats.constant), advantages, 0.0)
    return advantages.to(rewards.dtype)
