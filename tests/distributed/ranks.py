"""What every rank of a multi-process test needs: its rank, the strategy it names, and how it leaves results.

The workers (:mod:`tests.distributed.worker` and the others in this folder) run as torchrun-style processes started by
:func:`tests.distributed.launch.run_ranks`; these helpers read the rank from their variables and write what the test
process reads back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from lightning_grpo import GRPOModule
from lightning_grpo.distributed import full_adapter_state_dict


def rank() -> int:
    """This process's rank (0 outside a launched run)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def make_strategy(name: str, **options: Any) -> Any:
    """``"ddp"``, ``"fsdp"`` (FSDP2 over 2 ranks) or ``"single"`` (one process)."""
    if name == "ddp":
        return DDPStrategy(**options)
    if name == "fsdp":
        return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, **options)
    return "auto"


def world_of(strategy: str) -> int:
    """Processes of a strategy name."""
    return 1 if strategy == "single" else 2


def save_adapter(module: GRPOModule, path: Path) -> None:
    """Gather the adapter (every rank calls) and save it on rank zero."""
    state = full_adapter_state_dict(module.policy)
    if rank() == 0:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, path)


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON."""
    path.write_text(json.dumps(value, indent=1))


def logged(trainer: Any) -> dict[str, float]:
    """The trainer's logged metrics as floats."""
    return {name: float(value) for name, value in trainer.callback_metrics.items()}
