"""lightning_grpo: GRPO fine-tuning of language models with LoRA, as a PyTorch Lightning module."""

from lightning_grpo.config import GRPOConfig
from lightning_grpo.data import PromptDataModule
from lightning_grpo.module import GRPOModule
from lightning_grpo.policy import PolicyConfig
from lightning_grpo.rewards import RewardFunctions, RewardScores
from lightning_grpo.rollout import Rollout, TokenLogProbs
from lightning_grpo.step import LossCounts, StepContext, StepOutput, UpdateBatch

__version__ = "0.1.0"

__all__ = [
    "GRPOConfig",
    "GRPOModule",
    "LossCounts",
    "PolicyConfig",
    "PromptDataModule",
    "RewardFunctions",
    "RewardScores",
    "Rollout",
    "StepContext",
    "StepOutput",
    "TokenLogProbs",
    "UpdateBatch",
    "__version__",
]
