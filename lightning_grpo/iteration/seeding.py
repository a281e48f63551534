"""Per-step randomness of a GRPO run: a seed from (run seed, step, rank), so a resumed run samples the same."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["seeded", "step_seed"]


def step_seed(seed: int, step: int, rank: int, offset: int = 0) -> int:
    """A seed that depends only on the run's ``seed``, the optimizer ``step``, the ``rank`` and an ``offset``.

    Example::

        >>> step_seed(0, 0, 0), step_seed(0, 1, 0) != step_seed(0, 0, 1)
        (0, True)
    """
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729 + offset) % (2**63)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's generators (CPU, and ``device`` if CUDA) inside the block; the outer state is restored after."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
