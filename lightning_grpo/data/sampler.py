"""A deterministic, resumable sampler: the order of an epoch depends only on (seed, epoch), on every rank.

:class:`StreamLoader` is the training DataLoader over a :class:`StreamSampler`: Lightning sees its ``state_dict`` /
``load_state_dict`` and saves and restores the sampler's position with the fit loop's state in checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

__all__ = ["ResumableSampler", "StreamLoader", "StreamSampler"]


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` (also on one process) that can resume in the middle of an epoch.

    Lightning calls :meth:`set_epoch` at the start of every epoch, so the permutation is ``f(seed, epoch)`` and a
    resumed run sees the same prompts in the same order. Being a ``DistributedSampler`` already, Lightning leaves it in
    place under DDP/FSDP instead of wrapping it; each rank gets a disjoint slice of the same permutation, padded so
    every rank has the same number of batches.

    Args:
        num_samples: Dataset length.
        num_replicas: World size.
        rank: This process's global rank.
        shuffle: Shuffle each epoch.
        seed: Seed of the permutation.
        drop_last: Drop the tail that does not divide evenly across ranks instead of padding.

    Example::

        >>> sampler = ResumableSampler(6, num_replicas=1, rank=0, seed=0)
        >>> sampler.set_epoch(0); first = list(sampler)
        >>> sampler.set_epoch(0); sampler.skip(2); list(sampler) == first[2:]
        True
    """

    def __init__(
        self,
        num_samples: int,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            range(num_samples), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self._skip = 0

    def skip(self, num_samples: int) -> None:
        """Skip this many of this rank's samples on the next iteration only (resuming mid-epoch)."""
        self._skip = max(0, num_samples)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())[self._skip :]
        self._skip = 0
        return iter(indices)


class StreamSampler(ResumableSampler):
    """A :class:`ResumableSampler` whose epoch order is read batch by batch, by the DataLoader and by extra draws.

    Dynamic sampling (``docs/dynamic-sampling.md``) draws more prompts within a step. They come from the same order
    as the training batches, from one cursor, so no prompt repeats within an epoch and an epoch ends sooner when
    prompts are drawn. Its :meth:`state_dict` records the cursor and the batches handed to the DataLoader, so a run
    resumed mid-epoch sees exactly the prompts, in the order, the uninterrupted run saw. Without extra draws it gives
    the same batches as :class:`ResumableSampler`.

    Args:
        num_samples: Dataset length.
        batch_size: Prompts per batch (training batches and extra draws alike).
        num_replicas: World size.
        rank: This process's global rank.
        shuffle: Shuffle each epoch.
        seed: Seed of the permutation.

    Example::

        >>> sampler = StreamSampler(8, batch_size=2, num_replicas=1, rank=0, shuffle=False)
        >>> sampler.set_epoch(0); stream = iter(sampler)
        >>> [next(stream), next(stream)], sampler.draw(), [next(stream), next(stream)]
        ([0, 1], [2, 3], [4, 5])
    """

    def __init__(
        self, num_samples: int, *, batch_size: int, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0
    ) -> None:
        super().__init__(num_samples, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self._order: list[int] = []
        self._cursor = 0
        self._handed: list[int] = []  # start positions of the batches given to the DataLoader this epoch
        self._pending: list[int] = []  # handed but not trained before a resume: given again first
        self._restore: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[int]:
        self._begin_epoch()
        while (start := self._next_start()) is not None:
            self._handed.append(start)
            yield from self._order[start : start + self.batch_size]

    def draw(self) -> list[int] | None:
        """The next ``batch_size`` indices of this epoch's order, or ``None`` when fewer remain."""
        if self._cursor + self.batch_size > len(self._order):
            return None
        start, self._cursor = self._cursor, self._cursor + self.batch_size
        return self._order[start : start + self.batch_size]

    def state_dict(self, trained: int) -> dict[str, Any]:
        """The stream's position, given how many of the handed batches were trained this epoch."""
        return {"epoch": self.epoch, "cursor": self._cursor, "handed": list(self._handed), "trained": trained}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` when the next iteration is of the same epoch (else start it afresh)."""
        self._restore = dict(state)

    def _begin_epoch(self) -> None:
        self._order = list(DistributedSampler.__iter__(self))  # this rank's slice of the epoch's permutation
        state, self._restore = self._restore, None
        if state is not None and state["epoch"] == self.epoch:
            trained = int(state["trained"])
            self._handed, self._pending = list(state["handed"][:trained]), list(state["handed"][trained:])
            self._cursor = int(state["cursor"])
        else:
            self._handed, self._pending, self._cursor = [], [], self._skip
        self._skip = 0

    def _next_start(self) -> int | None:
        if self._pending:
            return self._pending.pop(0)
        if self._cursor + self.batch_size > len(self._order):
            return None
        start, self._cursor = self._cursor, self._cursor + self.batch_size
        return start


class StreamLoader(DataLoader):
    """The training DataLoader over a :class:`StreamSampler`, resumable in Lightning's sense.

    Lightning keeps the ``state_dict()`` of a training loader that has ``state_dict`` and ``load_state_dict`` in the
    fit loop's state of each checkpoint (``loops.fit_loop.state_dict.combined_loader``), and on resume hands it to
    :meth:`load_state_dict` before the first batch is drawn; a mid-epoch resume then continues with the prompts not
    trained yet, without Lightning's "your dataloader is not resumable" warning. The position lives in the sampler
    alone: this class only passes it through.

    Args:
        dataset: The records.
        sampler: The epoch order and its position.
        trained: Returns how many batches of the current epoch were trained; a batch handed out (prefetched by
            workers, or interrupted before its update) but not trained is given again after a resume.
        **kwargs: The other arguments of ``DataLoader`` (``batch_size`` must be the sampler's).

    Example::

        >>> sampler = StreamSampler(8, batch_size=2, num_replicas=1, rank=0, shuffle=False)
        >>> loader = StreamLoader(list(range(8)), sampler=sampler, trained=lambda: 1, batch_size=2)
        >>> sampler.set_epoch(0); first = next(iter(loader))
        >>> state = loader.state_dict()
        >>> again = StreamLoader(list(range(8)), sampler=StreamSampler(8, batch_size=2, num_replicas=1, rank=0,
        ...                      shuffle=False), trained=lambda: 0, batch_size=2)
        >>> again.load_state_dict(state); again.sampler.set_epoch(0); [b.tolist() for b in again]
        [[2, 3], [4, 5], [6, 7]]
    """

    def __init__(self, dataset: Any, *, sampler: StreamSampler, trained: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.trained = trained

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position (:meth:`StreamSampler.state_dict`), saved by Lightning in checkpoints."""
        return self.sampler.state_dict(trained=self.trained())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` at the next iteration (Lightning calls it before the resumed epoch)."""
        self.sampler.load_state_dict(state_dict)
