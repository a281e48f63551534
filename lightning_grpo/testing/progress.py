"""A warm-up's progress on stderr, at most every few seconds: a long warm-up is never silent."""

from __future__ import annotations

import sys
import time

__all__ = ["StepProgress"]


class StepProgress:
    """Prints ``<label>: step i/N`` on stderr when ``every`` seconds have passed since the start or the last line.

    Args:
        label: What runs, e.g. ``"warm-up"``.
        steps: Steps in all.
        every: Seconds between two lines.
    """

    def __init__(self, label: str, steps: int, every: float = 8.0) -> None:
        self.label, self.steps, self.every = label, steps, every
        self.last = time.monotonic()

    def step(self, done: int) -> None:
        """Report ``done`` steps if the last line is ``every`` seconds old."""
        now = time.monotonic()
        if now - self.last >= self.every:
            print(f"{self.label}: step {done}/{self.steps}", file=sys.stderr, flush=True)
            self.last = now
