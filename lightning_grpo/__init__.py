"""lightning_grpo: GRPO fine-tuning of language models with LoRA, as a PyTorch Lightning module."""

import logging


def _drop_hub_kernel_hint(record: logging.LogRecord) -> bool:
    """bitsandbytes, imported by peft whether or not a model is quantized, warns on CPUs with AVX-512 BF16 that its
    optional hub kernel is missing; its own CPU kernel serves instead (the one the quantization tests run), and the hub
    kernel would need the network at run time. Only that one message is dropped."""
    return not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_hub_kernel_hint)


def _drop_lightning_tips(record: logging.LogRecord) -> bool:
    """Lightning's advertising tips (``💡 Tip: ... litlogger``, ``... litmodels``) would open the output of every
    run, from Python as from the command line; only they are dropped, every other info line stays."""
    return not record.getMessage().startswith("💡 Tip")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(_drop_lightning_tips)

from lightning_grpo.backends import RolloutBackend, VLLMConfig  # noqa: E402 - after the filter; no vLLM import
from lightning_grpo.config import GRPOConfig  # noqa: E402
from lightning_grpo.data import PromptDataModule  # noqa: E402
from lightning_grpo.iteration import IterationContext, LossCounts, StepOutput, UpdateBatch  # noqa: E402
from lightning_grpo.module import GRPOModule  # noqa: E402
from lightning_grpo.policy import PolicyConfig  # noqa: E402
from lightning_grpo.rewards import RewardFunctions, RewardScores  # noqa: E402
from lightning_grpo.rollout import Rollout, TokenLogProbs  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "GRPOConfig",
    "GRPOModule",
    "IterationContext",
    "LossCounts",
    "PolicyConfig",
    "PromptDataModule",
    "RewardFunctions",
    "RewardScores",
    "Rollout",
    "RolloutBackend",
    "StepOutput",
    "TokenLogProbs",
    "UpdateBatch",
    "VLLMConfig",
    "__version__",
]
