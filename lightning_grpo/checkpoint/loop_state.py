"""A checkpoint saved inside a GRPO iteration resumes Lightning's logger step at that iteration, not one past it."""

from __future__ import annotations

from typing import Any

__all__ = ["align_logger_step"]


def align_logger_step(checkpoint: dict[str, Any]) -> bool:
    """Store the logger step of a checkpoint saved inside an iteration one lower, in place, so it resumes at it.

    Lightning's training loop counts a batch ``ready`` (and ``started``) when it fetches it, ``processed`` when its
    ``training_step`` returns and ``completed`` after ``on_train_batch_end``; its logger step (the ``step`` column of
    ``metrics.csv``, one per iteration) grows after the iteration's metrics are written. A checkpoint saved between
    fetch and return (Ctrl-C while sampling or scoring, a stop at the next iteration's start after SIGTERM) holds a
    batch fetched but not processed: resuming from it, Lightning runs that batch again and, taking the checkpoint for
    one saved after a batch's end but before its logger step grew, adds one to the logger step first. The resumed
    metrics would then skip the iteration's step and end one past the uninterrupted run's. Stored one lower, the
    logger step resumes at the iteration's own. ``is_last_batch``, set when the unfinished batch was fetched, is
    cleared: the batch is not done. The data loader's own state counts only processed batches as trained
    (:class:`~lightning_grpo.data.sampler.StreamLoader`), so the same prompts come again.

    Any other checkpoint (``ModelCheckpoint``'s, after an iteration or at an epoch's end) is left as it is. Call it
    once per checkpoint, when it is saved (``Callback.on_save_checkpoint``).

    Args:
        checkpoint: The dictionary Lightning is saving.

    Returns:
        Whether the checkpoint was changed.

    Example::

        >>> fetched_not_processed = {"ready": 6, "started": 6, "processed": 5, "completed": 5}
        >>> loop = {"epoch_loop.batch_progress": {"total": fetched_not_processed, "is_last_batch": True},
        ...         "epoch_loop.state_dict": {"_batches_that_stepped": 5}}
        >>> align_logger_step({"loops": {"fit_loop": loop}}), loop["epoch_loop.state_dict"]
        (True, {'_batches_that_stepped': 4})
    """
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    progress, state = fit_loop.get("epoch_loop.batch_progress"), fit_loop.get("epoch_loop.state_dict")
    if not isinstance(progress, dict) or not isinstance(state, dict) or not _unfinished(progress.get("total")):
        return False
    state["_batches_that_stepped"] = int(state.get("_batches_that_stepped", 0)) - 1
    progress["is_last_batch"] = False
    return True


def _unfinished(counts: Any) -> bool:
    """A batch fetched and not processed, every processed batch completed: saved before a ``training_step`` ended."""
    if not isinstance(counts, dict) or not {"ready", "processed", "completed"} <= set(counts):
        return False
    return counts["ready"] > counts["processed"] == counts["completed"]
