"""What one GRPO iteration reports when it ends: the ``train/`` metrics it logs and the :class:`StepOutput` that
callbacks read in ``on_train_batch_end``."""

from __future__ import annotations

from torch import Tensor

from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.timing import PhaseTimer
from lightning_grpo.iteration.types import StepOutput, UpdateBatch
from lightning_grpo.rewards import RewardScores
from lightning_grpo.rollout import Rollout

__all__ = ["iteration_report"]


def iteration_report(
    loss: Tensor,
    metrics: dict[str, Tensor],
    rollout: Rollout,
    scores: RewardScores,
    advantages: Tensor,
    update: UpdateBatch,
    config: GRPOConfig,
    timer: PhaseTimer,
) -> tuple[dict[str, Tensor], StepOutput]:
    """The metrics to log (``train/loss``, ``train/<name>`` of each update metric: global values) and the output.

    Args:
        loss: The iteration's mean mini-batch loss over all ranks, detached.
        metrics: The update's statistics (global, 0-dim).
        rollout: The rollout trained on (after dynamic sampling, if any).
        scores: Its rewards.
        advantages: Its advantages, ``(N,)`` or ``(N, T)``.
        update: What the update trained on (its ``loss_mask``).
        config: The module's settings (``update.ppo_epochs``: passes over the rollout).
        timer: The iteration's phase timer; each reward function's seconds join its timings as ``score/<name>``.
    """
    logged = {f"train/{name}": value for name, value in {"loss": loss, **metrics}.items()}
    output = StepOutput(
        loss=loss,
        rollout=rollout,
        rewards=scores,
        advantages=advantages,
        metrics=metrics,
        loss_mask=update.loss_mask,
        ppo_epochs=config.update.ppo_epochs,
        timings={**timer.seconds, **{f"score/{name}": s for name, s in scores.seconds.items()}},  # per reward
    )
    return logged, output
