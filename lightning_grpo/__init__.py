"""lightning_grpo: GRPO fine-tuning of language models with LoRA, as a PyTorch Lightning module."""

import logging


def _drop_hub_kernel_hint(record: logging.LogRecord) -> bool:
    """bitsandbytes, imported by peft whether or not a model is quantized, warns on CPUs with AVX-512 BF16 that its
    optional hub kernel is missing; its own CPU kernel serves instead (the one the quantization tests run), and the hub
    kernel would need the network at run time. Only that one message is dropped."""
    return not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_hub_kernel_hint)

from lightning_grpo.config import GRPOConfig  # noqa: E402 - after the filter above
from lightning_grpo.data import PromptDataModule  # noqa: E402
from lightning_grpo.module import GRPOModule  # noqa: E402
from lightning_grpo.policy import PolicyConfig  # noqa: E402
from lightning_grpo.rewards import RewardFunctions, RewardScores  # noqa: E402
from lightning_grpo.rollout import Rollout, TokenLogProbs  # noqa: E402
from lightning_grpo.rollout.vllm_settings import VLLMConfig  # noqa: E402 - settings only: vLLM is not imported
from lightning_grpo.step import LossCounts, StepContext, StepOutput, UpdateBatch  # noqa: E402

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
    "VLLMConfig",
    "__version__",
]
