"""Phase 2 of a GRPO iteration, ``GRPOModule.score``: the reward functions on a rollout (:func:`score_rollout`).

Every reward function is called by keyword on the rollout's prompts and completions (strings, or messages for
conversational prompts), the data's columns, and :data:`~lightning_grpo.iteration.fit_checks.STEP_KEYWORDS`; the
weighted sum, each function's rewards and, for an estimator that needs them (``grpo_process``), the step rewards
come back on the module's device.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.process_supervision import gather_step_rewards
from lightning_grpo.rewards import RewardFunctions, RewardScores, TrainerState
from lightning_grpo.rollout import Rollout

__all__ = ["score_rollout"]


def score_rollout(
    rewards: RewardFunctions,
    rollout: Rollout,
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: TrainerState,
    *,
    device: torch.device,
) -> RewardScores:
    """Every reward function on ``rollout``, weighted; ``NaN`` where every function returned ``None``.

    Args:
        rewards: The module's reward functions.
        rollout: The rollout to score.
        config: The module's settings (the advantage estimator decides whether step rewards are gathered).
        tokenizer: The module's tokenizer (step ends as token positions).
        trainer_state: Where training is: the ``trainer_state`` keyword of the reward functions.
        device: Where the rewards go (the module's device).
    """
    scores = rewards(
        rollout.prompts,
        rollout.completions,
        rollout.columns,
        completion_ids=rollout.completion_token_ids,
        completion_lengths=rollout.completion_lengths.tolist(),
        trainer_state=trainer_state,
    )
    per_function = {k: v.to(device) for k, v in scores.per_function.items()}
    steps = gather_step_rewards(config, tokenizer, rollout, scores, rewards)  # grpo_process only
    return RewardScores(scores.rewards.to(device), per_function, scores.seconds, scores.steps, steps)
