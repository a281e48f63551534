"""The optimizer of a GRPO run: over the adapter's parameters only (the base is frozen), with an optional scheduler.

``GRPOModule(optimizer=..., lr_scheduler=...)`` takes the two builders below; the command line fills them from
``model.init_args.optimizer`` / ``lr_scheduler`` (``class_path`` plus ``init_args``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["LRSchedulerCallable", "OptimizerCallable", "adapter_optimizer"]

#: Builds the optimizer from the parameters it updates.
OptimizerCallable = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
#: Builds a learning-rate scheduler from the optimizer.
LRSchedulerCallable = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def adapter_optimizer(
    policy: nn.Module, optimizer: OptimizerCallable | None = None, lr_scheduler: LRSchedulerCallable | None = None
) -> tuple[torch.optim.Optimizer, Any]:
    """A new optimizer over ``policy``'s trainable parameters (``AdamW(lr=1e-5)`` without ``optimizer``) and its
    scheduler (``None`` without ``lr_scheduler``).

    Example::

        >>> layer = nn.Linear(2, 2)
        >>> layer.bias.requires_grad_(False)  # doctest: +ELLIPSIS
        Parameter containing:...
        >>> opt, scheduler = adapter_optimizer(layer)
        >>> [p.shape for p in opt.param_groups[0]["params"]], scheduler
        ([torch.Size([2, 2])], None)
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    built = optimizer(params) if optimizer else torch.optim.AdamW(params, lr=1e-5)
    return built, None if lr_scheduler is None else lr_scheduler(built)
