"""No silent zero-signal runs: a step whose groups all have equal rewards, or whose rewards are all ``None``, trains
on nothing (every advantage is 0). Log the fraction of such groups and tell the user, once, why and what to do.

See ``docs/troubleshooting.md`` and ``docs/dynamic-sampling.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.dynamic_sampling import informative_groups
from lightning_grpo.rewards import RewardScores
from lightning_grpo.rollout import Rollout

if TYPE_CHECKING:
    from lightning_grpo.module import GRPOModule

__all__ = ["NO_REWARD_MESSAGE", "ZERO_STD_MESSAGE", "check_signal"]

#: Warned once when every reward function returned ``None`` for every row of a step.
NO_REWARD_MESSAGE = (
    "Every reward function returned None for every completion of step {step}: no reward, no advantage, a loss of 0. "
    "Check that the reward functions apply to this data (their columns, e.g. `answer`, must be in the dataset) and "
    "return numbers for the rows they should score."
)
#: Warned once when every group of a step has zero reward variance.
ZERO_STD_MESSAGE = (
    "All {groups} groups of step {step} have equal rewards within each group (zero variance): every advantage is 0, "
    "so the policy loss is 0 and the policy does not learn. The task is too hard (or too easy) for the model, or the "
    "reward is constant. Fixes: more samples per prompt (num_generations) or a higher temperature, easier prompts "
    "or a denser reward, or GRPOConfig(dynamic_sampling=True) to sample more prompts until groups differ. "
    "train/zero_std_frac tracks the fraction of such groups."
)


def check_signal(module: GRPOModule, rollout: Rollout, scores: RewardScores) -> None:
    """Log ``train/zero_std_frac`` (global over ranks) and warn once when the whole step carries no signal.

    Args:
        module: The module whose step it is (for logging, the rank reduction and the warn-once flags).
        rollout: The step's rollout.
        scores: Its rewards.
    """
    starts, informative = informative_groups(scores.rewards, rollout.group_ids)
    local = [len(starts), int((~informative).sum()), int(scores.valid.sum())]
    groups, zero, valid = module._sum_across_ranks(torch.tensor(local, dtype=torch.float64, device=module.device))
    fraction = (zero / groups.clamp(min=1)).float()
    module.log("train/zero_std_frac", fraction, on_step=True, prog_bar=True, batch_size=len(starts))
    warned: set[str] = module.__dict__.setdefault("_zero_signal_warned", set())
    kind = "no_reward" if valid == 0 else "zero_std" if zero == groups else None
    if kind is None or kind in warned:
        return
    warned.add(kind)
    message = NO_REWARD_MESSAGE if kind == "no_reward" else ZERO_STD_MESSAGE
    rank_zero_warn(message.format(step=module.global_step, groups=int(groups)))
