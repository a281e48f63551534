"""The batch Lightning will hand to the next ``training_step``, drawn one batch early from the fit loop's data fetcher.

One step ahead (``GRPOConfig.backend.async_rollout``, :mod:`lightning_grpo.backends.ahead`) samples the next
iteration's rollout during this one's update, so it must know the next batch now. :func:`next_batch` draws it early
from the fetcher's iterator and holds it there (:class:`_Lookahead`), so Lightning hands exactly it to the next
iteration: same prompts, same order, same number of iterations as without the look-ahead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher

__all__ = ["next_batch"]


class _Lookahead(Iterator[Any]):
    """The fit loop's batch iterator, with one item drawn early and held until Lightning asks for it."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator, self.held = iterator, deque[Any]()

    def __next__(self) -> Any:
        return self.held.popleft() if self.held else next(self.iterator)

    def peek(self) -> Any:
        """The next item, drawn now (``StopIteration`` at the end)."""
        if not self.held:
            self.held.append(next(self.iterator))
        return self.held[0]


def next_batch(trainer: Any, updates: int) -> Mapping[str, Sequence[Any]] | None:
    """The batch Lightning will hand to the next ``training_step``, drawn now from the fit loop's data fetcher and
    held there; ``None`` when there is none to know of: no trainer, the epoch's last batch, a fit that stops after
    this iteration (``max_steps`` reached by its ``updates`` optimizer steps, ``should_stop``), a fetcher of another
    kind.

    This reads Lightning's fetcher (``_PrefetchDataFetcher``, Lightning 2.x): a batch it prefetched itself (a loader
    without a length), else one drawn early from its iterator, which it then hands out and counts as usual (so the
    epoch's last batch is still known as such). Lightning passes the batch through its transfer hooks after; the next
    iteration compares what it was given with what was sampled
    (:meth:`~lightning_grpo.backends.ahead.AheadBackend.take`).

    Args:
        trainer: The running ``Trainer``, or ``None``.
        updates: The optimizer steps this iteration takes.
    """
    fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
    if not isinstance(fetcher, _PrefetchDataFetcher) or trainer.should_stop or fetcher.iterator is None:
        return None
    if 0 <= trainer.max_steps <= trainer.global_step + updates:
        return None
    if fetcher.batches:
        item = fetcher.batches[0]
    elif fetcher.done:
        return None
    else:
        if not isinstance(fetcher.iterator, _Lookahead):  # a new one each epoch (Lightning's iter(fetcher))
            fetcher.iterator = _Lookahead(fetcher.iterator)
        try:
            item = fetcher.iterator.peek()
        except StopIteration:
            return None
    return item[0] if isinstance(item, tuple) else item  # (batch, batch_idx, dataloader_idx)
