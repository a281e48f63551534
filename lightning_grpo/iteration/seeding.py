"""Per-iteration randomness of a GRPO run: a seed from (run seed, global step, rank), so a resumed run samples the
same."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["iteration_seed", "seeded"]


def iteration_seed(seed: int, global_step: int, rank: int, offset: int = 0) -> int:
    """The seed of an iteration: it depends only on the run's ``seed``, ``global_step`` (the optimizer steps taken
    before the iteration), the ``rank`` and an ``offset``.

    Example::

        >>> iteration_seed(0, 0, 0), iteration_seed(0, 1, 0) != iteration_seed(0, 0, 1)
        (0, True)
    """
    return (seed * 1_000_003 + global_step * 7_919 + rank * 104_729 + offset) % (2**63)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's generators (CPU, and ``device`` if CUDA) inside the block; the outer state is restored after."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
