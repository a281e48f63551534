"""lightning_grpo: GRPO fine-tuning of language models with LoRA, as a PyTorch Lightning module.

The public names below are imported when first used (PEP 562), so ``lightning-grpo --help`` answers without loading
torch, Lightning, transformers and peft; ``from lightning_grpo import GRPOModule`` works as ever.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static type checkers and IDEs see; at run time __getattr__ imports each name when used
    from lightning_grpo.backends import RolloutBackend, VLLMConfig
    from lightning_grpo.config import GRPOConfig
    from lightning_grpo.data import PromptDataModule
    from lightning_grpo.iteration import IterationContext, LossCounts, StepOutput, UpdateBatch
    from lightning_grpo.module import GRPOModule
    from lightning_grpo.policy import PolicyConfig
    from lightning_grpo.rewards import RewardFunctions, RewardScores
    from lightning_grpo.rollout import Rollout, TokenLogProbs


def _drop_hub_kernel_hint(record: logging.LogRecord) -> bool:
    """bitsandbytes, imported by peft whether or not a model is quantized, warns on CPUs with AVX-512 BF16 that its
    optional hub kernel is missing; its own CPU kernel serves instead (the one the quantization tests run), and the hub
    kernel would need the network at run time. Only that one message is dropped."""
    return not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


# The filters attach to named loggers, which exist before (and whether or not) their libraries are imported.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_hub_kernel_hint)


def _drop_lightning_tips(record: logging.LogRecord) -> bool:
    """Lightning's advertising tips (``💡 Tip: ... litlogger``, ``... litmodels``) would open the output of every
    run, from Python as from the command line; only they are dropped, every other info line stays."""
    return not record.getMessage().startswith("💡 Tip")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(_drop_lightning_tips)

__version__ = "0.1.0"

#: Public name -> the module it is imported from when first used.
_EXPORTS = {
    "GRPOConfig": "lightning_grpo.config",
    "GRPOModule": "lightning_grpo.module",
    "IterationContext": "lightning_grpo.iteration",
    "LossCounts": "lightning_grpo.iteration",
    "PolicyConfig": "lightning_grpo.policy",
    "PromptDataModule": "lightning_grpo.data",
    "RewardFunctions": "lightning_grpo.rewards",
    "RewardScores": "lightning_grpo.rewards",
    "Rollout": "lightning_grpo.rollout",
    "RolloutBackend": "lightning_grpo.backends",
    "StepOutput": "lightning_grpo.iteration",
    "TokenLogProbs": "lightning_grpo.rollout",
    "UpdateBatch": "lightning_grpo.iteration",
    "VLLMConfig": "lightning_grpo.backends",
}

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


def __getattr__(name: str) -> Any:
    """Import a public name (or a subpackage, ``lightning_grpo.testing``) when it is first used."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # found directly from now on
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, the public ones not yet imported included."""
    return sorted({*globals(), *__all__})
