"""What the phases of a GRPO iteration take from the module: a small, explicit :class:`IterationContext`.

The phases (:mod:`~lightning_grpo.iteration.update`, :mod:`~lightning_grpo.iteration.dynamic_sampling`,
:mod:`~lightning_grpo.iteration.zero_signal`) never reach into the module: ``training_step`` builds one context per
iteration (:meth:`GRPOModule.iteration_context <lightning_grpo.module.GRPOModule.iteration_context>`) and hands it,
with the module's overridable methods (``generate``, ``score``, ``compute_loss``, ...) as explicit callables, to
each phase.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.algorithms.statistics import SumAcrossRanks
from lightning_grpo.iteration.timing import PhaseTimer

__all__ = ["IterationContext", "any_rank"]


def any_rank(flag: bool, sum_across_ranks: SumAcrossRanks, device: torch.device) -> bool:
    """Whether ``flag`` holds on any rank (a collective: every rank must call it the same number of times).

    Example::

        >>> any_rank(True, lambda t: t, torch.device("cpu"))
        True
    """
    return bool(sum_across_ranks(torch.tensor(float(flag), device=device)) > 0)


@dataclass(frozen=True)
class IterationContext:
    """What one GRPO iteration's phases need from the module, built by the module once per iteration.

    Attributes:
        device: The module's device: tensors for collectives are made there.
        global_step: ``trainer.global_step`` (optimizer steps taken) when the iteration began (0 without a trainer).
        seed: The iteration's seed, from the run's seed, ``global_step`` and the rank (mini-batch shuffling uses it).
        grad_scale: Factor on each loss before backward (the world size under data parallelism, whose gradients
            are averaged, so that each rank's loss is its share of the global loss).
        sum_across_ranks: Sums a tensor over ranks on the strategy's process group (identity in one process).
        log: Logs one metric, as ``LightningModule.log``.
        timer: Times the phases (``generate``, ``score``, ``update``, ...).
        warned: Keys of the warnings already given in this run: :meth:`warn_once` reads and adds to it (the module
            hands the same set to every iteration's context).
        skipped: Optimizer steps (``global_step`` values) skipped in this run for a non-finite loss or gradient
            (``on_nonfinite="skip"``; the module hands the same list to every iteration's context).

    Example::

        >>> context = IterationContext(torch.device("cpu"), 0, 0, 1.0, lambda t: t, print, PhaseTimer())
        >>> context.any_rank(False), context.all_ranks(True)
        (False, True)
    """

    device: torch.device
    global_step: int
    seed: int
    grad_scale: float
    sum_across_ranks: SumAcrossRanks
    log: Callable[..., Any]
    timer: PhaseTimer
    warned: set[str] = field(default_factory=set)
    skipped: list[int] = field(default_factory=list)

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a collective)."""
        return any_rank(flag, self.sum_across_ranks, self.device)

    def all_ranks(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (a collective)."""
        return not self.any_rank(not flag)

    def warn_once(self, key: str, message: str) -> None:
        """Warn with ``message`` on rank zero, unless a warning of this ``key`` was given already in this run."""
        if key not in self.warned:
            self.warned.add(key)
            rank_zero_warn(message)
