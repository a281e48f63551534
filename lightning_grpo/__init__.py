"""lightning_grpo: GRPO fine-tuning of language models with LoRA, as a PyTorch Lightning module."""

from lightning_grpo.config import GRPOConfig
from lightning_grpo.data import PromptDataModule
from lightning_grpo.module import GRPOModule, StepOutput
from lightning_grpo.policy import PolicyConfig
from lightning_grpo.rewards import RewardFunctions, RewardScores
from lightning_grpo.rollout import Rollout

__version__ = "0.1.0"

__all__ = [
    "GRPOConfig",
    "GRPOModule",
    "PolicyConfig",
    "PromptDataModule",
    "RewardFunctions",
    "RewardScores",
    "Rollout",
    "StepOutput",
    "__version__",
]
