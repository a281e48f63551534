"""No silent zero-signal runs: an iteration whose groups all have equal rewards, or whose rewards are all ``None``,
trains on nothing (every advantage is 0). Log the fraction of such groups and tell the user, once, why and what to do.

See ``docs/troubleshooting.md`` and ``docs/dynamic-sampling.md``.
"""

from __future__ import annotations

import torch

from lightning_grpo.algorithms.process_supervision import constant_step_groups
from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.iteration.dynamic_sampling import informative_groups
from lightning_grpo.rewards import RewardScores
from lightning_grpo.rollout import Rollout

__all__ = ["NO_REWARD_MESSAGE", "NO_STEP_MESSAGE", "ZERO_STD_MESSAGE", "check_signal"]

#: Warned once when every reward function returned ``None`` for every row of an iteration.
NO_REWARD_MESSAGE = (
    "Every reward function returned None for every completion of the iteration at step {step}: no reward, no "
    "advantage, a loss of 0. Check that the reward functions apply to this data (their columns, e.g. `answer`, must "
    "be in the dataset) and return numbers for the rows they should score."
)
#: Warned once when no completion of a ``grpo_process`` iteration has a step reward.
NO_STEP_MESSAGE = (
    "No completion of the iteration at step {step} has a step reward (advantage_estimator='grpo_process'): every "
    "advantage is 0. Check that the environment returns EnvStep.reward for its turns, or that the step reward "
    "functions return StepRewards (not None) for the completions they should score; train/process/no_step_frac "
    "tracks the fraction without steps."
)
#: Warned once when every group of an iteration has zero reward variance.
ZERO_STD_MESSAGE = (
    "All {groups} groups of the iteration at step {step} have equal rewards within each group (zero variance): every "
    "advantage is 0, so the policy loss is 0 and the policy does not learn. The task is too hard (or too easy) for "
    "the model, or the reward is constant. Fixes: more samples per prompt (num_generations) or a higher temperature, "
    "easier prompts or a denser reward, or advantages.dynamic_sampling=True to sample more prompts until groups "
    "differ. train/zero_std_frac tracks the fraction of such groups."
)


def check_signal(context: IterationContext, rollout: Rollout, scores: RewardScores) -> None:
    """Log ``train/zero_std_frac`` (global over ranks) and warn once when the whole iteration carries no signal.

    Args:
        context: The iteration's context (logging, the rank reduction and the warn-once state).
        rollout: The iteration's rollout.
        scores: Its rewards.
    """
    if scores.step_rewards is not None:  # grpo_process: the signal is in the step rewards (docs/math.md)
        constant = constant_step_groups(scores.step_rewards, rollout.group_ids)
        num_groups, sums = len(constant), [constant.sum(), (~torch.isnan(scores.step_rewards)).sum()]
    else:
        starts, informative = informative_groups(scores.rewards, rollout.group_ids)
        num_groups, sums = len(starts), [(~informative).sum(), scores.valid.sum()]
    local = torch.stack([sums[0].new_tensor(num_groups), *sums]).double()  # on the rewards' device, no host sync
    groups, zero, valid = context.sum_across_ranks(local.to(context.device))
    fraction = (zero / groups.clamp(min=1)).float()
    context.log("train/zero_std_frac", fraction, on_step=True, prog_bar=True, batch_size=num_groups)
    kind = "no_reward" if valid == 0 else "zero_std" if zero == groups else None
    if kind is not None:
        message = ZERO_STD_MESSAGE if kind == "zero_std" else NO_REWARD_MESSAGE
        message = NO_STEP_MESSAGE if kind == "no_reward" and scores.step_rewards is not None else message
        context.warn_once(kind, message.format(step=context.global_step, groups=int(groups)))
