"""Process supervision in the algorithms layer: process advantages, step rewards of a group normalised together,
summed over the steps at or after each token.

Process supervision has one file per layer, each named ``process_supervision.py`` (the same feature in four
layers): ``algorithms`` (the advantages), ``rewards`` (:class:`~lightning_grpo.rewards.StepRewards`, the process reward
model), ``rollout`` (step ends as token positions) and ``iteration`` (gathering the step rewards of one GRPO iteration).


DeepSeekMath (Shao et al., 2024, arXiv:2402.03300) §4.1.3, "process supervision": completion ``i`` of a group has
steps ending at token indices ``index(1) < ... < index(K_i)`` with rewards ``r_i^index(j)``. Every step reward of the
group is normalised by the group's mean and standard deviation, ``r~ = (r - mean(R)) / std(R)``, ``R`` the step rewards
of all the group's completions, and token ``t`` gets ``A_{i,t} = sum of r~_i^index(j) over index(j) >= t``.

Step rewards travel as one dense ``(N, T)`` tensor, ``step_rewards``: the reward of a step at the token where it ends,
NaN on every other token. The std options of outcome GRPO apply to the step rewards (``"group"``, ``"batch"`` over
every step of the global batch, ``"none"``), with the same ``eps``; a group whose step rewards are all equal (or that
has one step) gets 0. See ``docs/math.md`` ("Process supervision").
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import SumAcrossRanks, mean_std, moments

__all__ = ["check_step_rewards", "constant_step_groups", "process_advantages", "with_outcome_step"]


def check_step_rewards(step_rewards: Tensor, completion_mask: Tensor) -> None:
    """Refuse step rewards of the wrong shape, infinite ones, and steps that end on a token outside the completion.

    Args:
        step_rewards: ``(N, T)`` the reward of each step at its end token, NaN elsewhere.
        completion_mask: ``(N, T)`` the tokens a step may end on (1) and those it may not (0).

    Raises:
        ValueError: Naming the first offending row and token.
    """
    if step_rewards.shape != completion_mask.shape or step_rewards.ndim != 2:
        raise ValueError(
            f"step_rewards must be (N, T) like completion_mask; got {tuple(step_rewards.shape)} and "
            f"{tuple(completion_mask.shape)}"
        )
    if not torch.is_floating_point(step_rewards):
        raise TypeError(f"step_rewards must be a floating-point tensor, got dtype {step_rewards.dtype}")
    for problem, bad in (
        ("is not finite", torch.isinf(step_rewards)),
        ("ends outside the completion (a masked token)", ~torch.isnan(step_rewards) & ~completion_mask.bool()),
    ):
        if bool(bad.any()):
            row, token = (int(i) for i in torch.nonzero(bad)[0])
            value = float(step_rewards[row, token])
            raise ValueError(f"the step reward {value} of row {row} at token {token} {problem}")


def with_outcome_step(step_rewards: Tensor, rewards: Tensor, completion_mask: Tensor, weight: float) -> Tensor:
    """Add ``weight * rewards`` as the reward of a step ending at each row's last token of ``completion_mask``.

    A step reward already ending there is summed with it (one step). Rows whose reward is NaN, or without tokens,
    get no outcome step; ``weight == 0`` returns ``step_rewards`` unchanged.

    Example::

        >>> steps = torch.tensor([[float("nan"), 1.0, float("nan")], [float("nan")] * 3])
        >>> with_outcome_step(steps, torch.tensor([2.0, 3.0]), torch.tensor([[1, 1, 1], [1, 1, 0]]), 0.5)
        tensor([[   nan, 1.0000, 1.0000],
                [   nan, 1.5000,    nan]])
    """
    if weight == 0:
        return step_rewards
    mask = completion_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)
    last = torch.where(mask, positions, -1).amax(dim=1)  # (N,) -1 for a row without tokens
    rows = torch.nonzero((last >= 0) & ~torch.isnan(rewards)).flatten()
    out = step_rewards.clone()
    current = out[rows, last[rows]]
    out[rows, last[rows]] = torch.nan_to_num(current, nan=0.0) + weight * rewards[rows].to(out.dtype)
    return out


def _group_moments(values: Tensor, valid: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, ...]:
    """Per group: count, mean, unbiased std (0 below two steps) and whether all its values are equal; float64."""
    x = torch.where(valid, values, 0.0)
    count = torch.zeros(num_groups, dtype=torch.float64, device=x.device).index_add_(0, inverse, valid.sum(1).double())
    total = torch.zeros_like(count).index_add_(0, inverse, x.sum(1))
    mean = total / count.clamp(min=1)
    deviation = torch.where(valid, x - mean[inverse, None], 0.0)
    var = torch.zeros_like(count).index_add_(0, inverse, (deviation**2).sum(1)) / (count - 1).clamp(min=1)
    row_high = torch.where(valid, x, -torch.inf).amax(1)
    row_low = torch.where(valid, x, torch.inf).amin(1)
    high = torch.full_like(count, -torch.inf).scatter_reduce_(0, inverse, row_high, "amax")
    low = torch.full_like(count, torch.inf).scatter_reduce_(0, inverse, row_low, "amin")
    return count, mean, torch.where(count > 1, var.sqrt(), 0.0), high <= low


def constant_step_groups(step_rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``(G,)`` bool per group (in ``torch.unique(group_ids)`` order): its step rewards are all equal, or absent.

    Such a group gets advantage 0 everywhere: no learning signal (``train/zero_std_frac`` under ``grpo_process``).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    return _group_moments(step_rewards.double(), ~torch.isnan(step_rewards), inverse, num_groups)[3]


def process_advantages(
    step_rewards: Tensor,
    group_ids: Tensor,
    completion_mask: Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-6,
    sum_across_ranks: SumAcrossRanks | None = None,
) -> Tensor:
    """Process-supervised GRPO advantages, per token (DeepSeekMath §4.1.3).

    Args:
        step_rewards: ``(N, T)`` the reward of each step at the token where the step ends, NaN elsewhere.
        group_ids: ``(N,)`` the group of each row (rows of one prompt; groups never straddle ranks).
        completion_mask: ``(N, T)`` tokens that get an advantage; masked tokens get 0 and may not end a step.
        scale: ``"group"`` (divide by the group's step-reward std), ``"batch"`` (by the std of every step reward of
            the global batch) or ``"none"`` (centre only).
        eps: Added to the std before dividing.
        sum_across_ranks: Sums a tensor over ranks; makes ``scale="batch"`` global.

    Returns:
        ``(N, T)`` advantages in ``step_rewards.dtype``: token ``t`` of row ``i`` gets the sum of the normalised
        rewards of the row's steps ending at ``t`` or later; 0 after the last step and on masked tokens.

    Raises:
        ValueError: A step reward that is infinite or ends on a masked token, or mismatched shapes.

    Example::

        >>> nan = float("nan")
        >>> steps = torch.tensor([[nan, 1.0, nan, 0.0], [nan, nan, 0.0, nan]])
        >>> process_advantages(steps, torch.tensor([0, 0]), torch.ones(2, 4), eps=0.0)  # R = {1, 0, 0}
        tensor([[ 0.5774,  0.5774, -0.5774, -0.5774],
                [-0.5774, -0.5774, -0.5774,  0.0000]])
    """
    check_step_rewards(step_rewards, completion_mask)
    if group_ids.shape != step_rewards.shape[:1]:
        raise ValueError(f"group_ids must be (N,) = ({step_rewards.shape[0]},); got {tuple(group_ids.shape)}")
    valid = ~torch.isnan(step_rewards)  # (N, T) where a step ends
    values = step_rewards.double()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    _, mean, std, constant = _group_moments(values, valid, inverse, num_groups)
    normalised = values - mean[inverse, None]  # (N, T)
    if scale == "group":
        normalised = normalised / (std[inverse, None] + eps)
    elif scale == "batch":
        sums = moments(values, valid)
        _, std_batch = mean_std(*(sums if sum_across_ranks is None else sum_across_ranks(sums)).unbind())
        normalised = normalised / (std_batch.nan_to_num(0.0) + eps)
    elif scale != "none":
        raise ValueError(f"unknown advantage scale {scale!r}; valid names: 'group', 'batch', 'none'")
    normalised = torch.where(valid & ~constant[inverse, None], normalised, 0.0)  # (N, T) zero where no step ends
    to_go = normalised.flip(1).cumsum(1).flip(1)  # sum over the steps ending at t or later
    return (to_go * completion_mask.bool()).to(step_rewards.dtype)
