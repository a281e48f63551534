"""A daemon thread that tells, every few seconds of a long GRPO iteration, which phase runs and for how long.

Used by :class:`~lightning_grpo.callbacks.GRPOProgressBar` (the phase in the bar, which it refreshes) and
:class:`~lightning_grpo.callbacks.phase_heartbeat.PhaseHeartbeat` (a log line, when there is no bar). The phase is
read from the module's :class:`~lightning_grpo.iteration.phase.PhaseClock` (:func:`watch_phases`); the thread reads
two attributes and calls ``show``: no host sync, no collective, nothing on the training thread but two assignments
per iteration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lightning_grpo.iteration import PhaseTimer
from lightning_grpo.iteration.phase import PhaseClock, describe_phase

__all__ = ["PhaseTicker", "watch_phases"]

_log = logging.getLogger(__name__)


def watch_phases(pl_module: Any) -> PhaseClock | None:
    """The module's :class:`PhaseClock`, put in place of its plain ``timer`` if need be; ``None`` without a timer.

    ``GRPOModule.training_step`` reads ``self.timer`` at the start of each iteration, so a clock set here times the
    phases from the next iteration on, with the same device and the seconds already counted.
    """
    timer = getattr(pl_module, "timer", None)
    if isinstance(timer, PhaseClock):
        return timer
    if not isinstance(timer, PhaseTimer):
        return None
    pl_module.timer = clock = PhaseClock.replacing(timer)
    return clock


class PhaseTicker:
    """Calls ``show(phase, seconds)`` every ``interval`` seconds of an iteration that has run ``interval`` s or more.

    ``phase`` is ``"generate 12s"`` (the phase running now and for how long,
    :func:`~lightning_grpo.iteration.phase.describe_phase`), ``None`` while no timed phase runs; ``seconds`` is how
    long the iteration has run. ``show`` runs on the ticker's thread, under a lock that :meth:`iteration_ended` also
    takes: once that returns, ``show`` is not called again for that iteration.

    Args:
        interval: Seconds between two calls (and before the first one of an iteration).
        show: What to do with them (refresh a bar, log a line).
    """

    def __init__(self, interval: float, show: Callable[[str | None, float], None]) -> None:
        self.interval, self.show = interval, show
        self.clock: PhaseClock | None = None
        self._since: float | None = None  # time.monotonic() at the running iteration's start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pl_module: Any) -> None:
        """Watch ``pl_module``'s phases and start the thread (a second call does nothing)."""
        self.clock = watch_phases(pl_module)
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lightning-grpo-phase-ticker", daemon=True)
            self._thread.start()

    def iteration_started(self) -> None:
        """An iteration starts now."""
        self._since = time.monotonic()

    def iteration_ended(self) -> None:
        """The iteration ended: nothing is shown until the next one starts."""
        with self._lock:
            self._since = None

    def stop(self) -> None:
        """Stop the thread (safe to call twice, or before :meth:`start`)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        self._since = None

    def tick(self, now: float | None = None) -> bool:
        """Call ``show`` when the iteration has run ``interval`` seconds or more; whether it was called."""
        now = time.monotonic() if now is None else now
        with self._lock:
            since = self._since
            if since is None or now - since < self.interval:
                return False
            self.show(describe_phase(self.clock, now), now - since)
            return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as error:  # a display that fails must not take the run down, nor print a traceback
                _log.warning("the phase display stopped: %s: %s", type(error).__name__, error)
                return
