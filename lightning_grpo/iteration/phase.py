"""Which phase of a GRPO iteration runs now: a :class:`~lightning_grpo.iteration.PhaseTimer` that also says so.

``GRPOModule.training_step`` already times each phase with its ``timer`` (``sync``, ``generate``, ``score``,
``old_logprobs``, ``reference``, ``update``). A :class:`PhaseClock` is such a timer that also keeps the phase running
now and when it started, in one attribute that another thread may read: the progress bar and the phase heartbeat show
it while an iteration runs (docs/callbacks.md). Reading it costs nothing on the training thread: no host sync, no
collective, one tuple written at each phase's start and end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lightning_grpo.iteration.timing import PhaseTimer

__all__ = ["PhaseClock", "describe_phase"]


class PhaseClock(PhaseTimer):
    """A :class:`~lightning_grpo.iteration.PhaseTimer` that keeps the phase running now in :attr:`current`.

    Args:
        device: As :class:`~lightning_grpo.iteration.PhaseTimer`'s (CUDA is synchronised at each phase's edges).

    Example::

        >>> clock = PhaseClock()
        >>> with clock("generate"):
        ...     clock.current[0]
        'generate'
        >>> clock.current is None
        True
    """

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__(device)
        #: ``(phase, time.monotonic() at its start)`` of the phase running now; ``None`` between phases.
        self.current: tuple[str, float] | None = None

    @classmethod
    def replacing(cls, timer: PhaseTimer) -> PhaseClock:
        """A clock that takes over ``timer``'s device and the seconds it has counted so far."""
        clock = cls(timer.device)
        clock.seconds = timer.seconds
        return clock

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Time the enclosed block as ``phase`` (as :class:`PhaseTimer` does) and name it the phase running now."""
        outer, self.current = self.current, (phase, time.monotonic())
        try:
            with super().__call__(phase):
                yield
        finally:
            self.current = outer  # a phase inside another one hands back to it


def describe_phase(clock: PhaseClock | None, now: float | None = None) -> str | None:
    """``"generate 12s"``: the phase running now and for how long; ``None`` when no phase runs.

    Args:
        clock: The module's clock (``None``: nothing to describe).
        now: ``time.monotonic()`` (read here when ``None``).
    """
    current = None if clock is None else clock.current  # one read: the training thread may replace it meanwhile
    if current is None:
        return None
    phase, start = current
    return f"{phase} {max(0.0, (time.monotonic() if now is None else now) - start):.0f}s"
