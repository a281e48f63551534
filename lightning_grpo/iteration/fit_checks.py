"""Checks at fit start, before the first rollout is sampled: what the reward functions need against the data, and
the batch sizes against the data loader's."""

from __future__ import annotations

from typing import Any

from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.dynamic_sampling import check_datamodule
from lightning_grpo.iteration.process_supervision import check_step_sources
from lightning_grpo.rewards import RewardFunctions

__all__ = ["STEP_KEYWORDS", "check_fit_inputs", "check_loader_batch_size", "check_reward_keywords"]

#: Keywords ``GRPOModule.score`` offers every reward function besides prompts, completions and the data's columns.
STEP_KEYWORDS = ("completion_ids", "completion_lengths", "trainer_state")


def check_reward_keywords(
    rewards: RewardFunctions, datamodule: Any, *, environment: bool, rollout_columns: Any = ()
) -> None:
    """Refuse reward functions whose parameters the data's columns cannot fill, naming the missing columns.

    Only a data module that holds its rows (:class:`~lightning_grpo.data.PromptDataModule`'s ``train_records``,
    set up by then) is checked; with an environment the keywords also come from it, so nothing is checked.

    Raises:
        RewardInputError: A function needs keywords that neither the columns nor the step offer.
    """
    records = getattr(datamodule, "train_records", None)
    if environment or not isinstance(records, list) or not records:
        return
    columns = sorted({key for row in records if isinstance(row, dict) for key in row} - {"prompt"})
    rewards.check_keywords([*columns, *rollout_columns, *STEP_KEYWORDS], where=f"the data (columns {columns})")


def check_fit_inputs(
    config: GRPOConfig, rewards: RewardFunctions, datamodule: Any, *, environment: bool, rollout_columns: Any = ()
) -> None:
    """Every fit-start check of the inputs: the reward functions' keywords against the data (and the columns the
    rollout adds, e.g. an agent rollout's ``agent_reward``), a source of step rewards for ``grpo_process``, and a
    data module that can give more prompts for ``dynamic_sampling``."""
    check_reward_keywords(rewards, datamodule, environment=environment, rollout_columns=rollout_columns)
    check_step_sources(config, rewards, environment=environment)
    if config.advantages.dynamic_sampling:
        check_datamodule(datamodule)


def check_loader_batch_size(config: GRPOConfig, dataloader: Any) -> None:
    """Check the batch sizes against the rollout of one batch of ``dataloader`` (its ``batch_size`` prompts × G).

    Raises:
        ValueError: The rollout is not a multiple of ``mini_batch_size``, itself of ``micro_batch_size``.
    """
    batch_size = getattr(dataloader, "batch_size", None)
    if isinstance(batch_size, int):
        config.check_rollout_size(batch_size * config.sampling.num_generations)
