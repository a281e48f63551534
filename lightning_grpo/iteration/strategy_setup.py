"""What a fit sets up on its strategy before the first iteration (``GRPOModule.setup``): :func:`set_up_strategy`.

Strategies GRPO cannot run are refused and every collective's wait is bounded
(:func:`lightning_grpo.distributed.set_up`); agent code and a quantized base are refused under FSDP2; checkpoint files
are read and written through :class:`~lightning_grpo.checkpoint.CheckedCheckpointIO`; on CPU, PyTorch's thread count
is set (:mod:`~lightning_grpo.iteration.cpu_threads`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch import Trainer
from torch import nn

from lightning_grpo import distributed
from lightning_grpo.checkpoint import install_checked_io
from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.cpu_threads import apply_default_cpu_threads
from lightning_grpo.policy.quantization import check_shardable
from lightning_grpo.rollout.agent_wiring import check_agent_strategy

__all__ = ["set_up_strategy"]


def set_up_strategy(
    trainer: Trainer, config: GRPOConfig, policy: nn.Module, *, agent_code: Callable[..., Any] | None
) -> None:
    """Check the trainer's strategy against the run and set it up for a fit; on CPU, set the threads.

    Args:
        trainer: The trainer (its strategy's process groups already made); its ``num_devices`` training processes on
            this node share its CPU cores, read only once the checks have passed.
        config: The module's settings.
        policy: The module's policy.
        agent_code: The module's agent code (``agent=``), or ``None``.

    Raises:
        ValueError: A strategy GRPO cannot run (FSDP1, tensor parallelism), or under FSDP2 agent code or a quantized
            base (each message names what to run instead).
    """
    strategy = trainer.strategy
    distributed.set_up(strategy, config, agents=agent_code is not None)
    check_agent_strategy(agent_code, fsdp2=distributed.is_fsdp2(strategy))
    if distributed.is_fsdp2(strategy):
        check_shardable(policy)  # a bitsandbytes base cannot be sharded: use DDP (docs/quantization.md)
    install_checked_io(strategy)  # an unreadable checkpoint file gets an error naming it
    apply_default_cpu_threads(strategy.root_device, policy, processes=trainer.num_devices)
