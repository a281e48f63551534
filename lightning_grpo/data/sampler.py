"""A deterministic, resumable sampler: the order of an epoch depends only on (seed, epoch), on every rank."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler

__all__ = ["ResumableSampler"]


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
