"""Wall-clock seconds per phase of a GRPO iteration (synchronising CUDA so the figures are real)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["PhaseTimer"]


class PhaseTimer:
    """Accumulates seconds per named phase; :meth:`reset` at the start of each step.

    Example::

        >>> timer = PhaseTimer()
        >>> with timer("generate"):
        ...     pass
        >>> list(timer.seconds)
        ['generate']
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        """Forget the previous step's phases."""
        self.seconds = {}

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Time the enclosed block and add it to ``phase``."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
