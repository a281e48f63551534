"""Loop state that resumes Lightning's logger step and epoch at the first iteration not yet written.

Two kinds of checkpoint would otherwise resume off by one. A checkpoint saved inside a GRPO iteration (a batch
fetched, not processed) would resume the logger step one past the iteration's (:func:`align_logger_step`). A
checkpoint saved at an epoch's end (``ModelCheckpoint`` in ``on_train_epoch_end``) would make Lightning 2.x run the
epoch's end again: when the module validates, one more logger step is counted without a batch, so a step label is
skipped, and the finished epoch is counted twice, so the sampler's epoch (its shuffle) is one ahead from then on
(:func:`resume_after_epoch_end`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["align_logger_step", "resume_after_epoch_end"]


def align_logger_step(checkpoint: dict[str, Any], num_batches: float | None = None) -> bool:
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

    A checkpoint saved at an epoch's end is stored as :func:`resume_after_epoch_end` leaves it. Any other checkpoint
    (``ModelCheckpoint``'s after an iteration) is left as it is. Call it once per checkpoint, when it is saved
    (``Callback.on_save_checkpoint``).

    Args:
        checkpoint: The dictionary Lightning is saving.
        num_batches: The batches of an epoch (``trainer.num_training_batches``), passed to
            :func:`resume_after_epoch_end`.

    Returns:
        Whether the checkpoint was changed.

    Example::

        >>> fetched_not_processed = {"ready": 6, "started": 6, "processed": 5, "completed": 5}
        >>> loop = {"epoch_loop.batch_progress": {"total": fetched_not_processed, "is_last_batch": True},
        ...         "epoch_loop.state_dict": {"_batches_that_stepped": 5}}
        >>> align_logger_step({"loops": {"fit_loop": loop}}), loop["epoch_loop.state_dict"]
        (True, {'_batches_that_stepped': 4})
    """
    if resume_after_epoch_end(checkpoint, num_batches):
        return True
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    progress, state = fit_loop.get("epoch_loop.batch_progress"), fit_loop.get("epoch_loop.state_dict")
    if not isinstance(progress, dict) or not isinstance(state, dict) or not _unfinished(progress.get("total")):
        return False
    state["_batches_that_stepped"] = int(state.get("_batches_that_stepped", 0)) - 1
    progress["is_last_batch"] = False
    return True


def resume_after_epoch_end(checkpoint: dict[str, Any], num_batches: float | None = None) -> bool:
    """Store a checkpoint saved at an epoch's end as one saved before the next iteration's batch is processed.

    ``ModelCheckpoint`` saves at an epoch's end in ``on_train_epoch_end``, after the epoch's last iteration has
    written its metrics and Lightning has counted the epoch ``processed``, before it counts it ``completed``.
    Resuming from that, Lightning 2.x runs the epoch's end again: its training loop, restarting on the epoch's last
    batch, counts one logger step more without training a batch when the module validates (the resumed metrics skip
    a step label), or trains the next epoch's first batch in the old epoch when it does not (its ``epoch`` column is
    one low); and the fit loop counts the epoch ``processed`` a second time, so every later epoch shuffles its
    prompts as the one after it (the rewards differ from an uninterrupted run's).

    Stored instead: the epoch ``completed`` when its data was used up (``is_last_batch``, or ``num_batches``
    batches), else ``processed`` one lower (the run stopped inside the epoch, at ``max_steps``: the epoch goes on);
    and the next batch fetched but not processed, the logger step one lower, as :func:`align_logger_step` stores a
    checkpoint saved inside an iteration. Lightning then resumes as after an interrupt at the next iteration's start:
    the next epoch starts as usual (``on_train_epoch_start``, the sampler's epoch) or the stopped one goes on, the
    data loader's state gives the prompts the uninterrupted run trains on next, and the logger step is the next
    iteration's. Idempotent: a stored checkpoint no longer looks saved at an epoch's end, so it can be called both
    when a checkpoint is saved and when it is loaded (``Callback.on_load_checkpoint``, for one saved without it).

    Args:
        checkpoint: The dictionary Lightning is saving or has loaded (before it restores its loops).
        num_batches: The batches of an epoch (``trainer.num_training_batches``), when known: an epoch cut short by
            ``limit_train_batches`` ends without ``is_last_batch``.

    Returns:
        Whether the checkpoint was changed.

    Example::

        >>> epoch = {"ready": 1, "started": 1, "processed": 1, "completed": 0}
        >>> batches = {"ready": 3, "started": 3, "processed": 3, "completed": 3}
        >>> loop = {"epoch_progress": {"total": epoch, "current": dict(epoch)},
        ...         "epoch_loop.batch_progress": {"total": batches, "current": dict(batches), "is_last_batch": True},
        ...         "epoch_loop.state_dict": {"_batches_that_stepped": 3}}
        >>> resume_after_epoch_end({"loops": {"fit_loop": loop}})
        True
        >>> epoch["completed"], batches["ready"], loop["epoch_loop.state_dict"]["_batches_that_stepped"]
        (1, 4, 2)
        >>> resume_after_epoch_end({"loops": {"fit_loop": loop}})  # already stored so
        False
    """
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    epochs, progress = fit_loop.get("epoch_progress"), fit_loop.get("epoch_loop.batch_progress")
    state = fit_loop.get("epoch_loop.state_dict")
    if not isinstance(epochs, dict) or not isinstance(progress, dict) or not isinstance(state, dict):
        return False
    if not _at_epoch_end(epochs.get("total")) or not _all_done(progress.get("total")):
        return False
    current = progress.get("current")
    ran = current["ready"] if _all_done(current) else None  # the epoch's batches
    used_up = num_batches is not None and ran is not None and ran >= num_batches
    finished = bool(progress.get("is_last_batch")) or used_up
    for counts in (epochs["total"], epochs.get("current")):
        if _at_epoch_end(counts):
            if finished:
                counts["completed"] = counts["processed"]
            else:
                counts["processed"] -= 1
    progress["total"]["ready"] += 1
    if finished:
        progress["current"] = {"ready": 1, "started": 0, "processed": 0, "completed": 0}
    elif isinstance(current, dict) and "ready" in current:
        current["ready"] += 1
    progress["is_last_batch"] = False
    state["_batches_that_stepped"] = int(state.get("_batches_that_stepped", 0)) - 1
    return True


def _unfinished(counts: Any) -> bool:
    """A batch fetched and not processed, every processed batch completed: saved before a ``training_step`` ended."""
    if not isinstance(counts, dict) or not {"ready", "processed", "completed"} <= set(counts):
        return False
    return counts["ready"] > counts["processed"] == counts["completed"]


def _all_done(counts: Any) -> bool:
    """Every batch fetched was processed and completed: saved after an iteration's ``on_train_batch_end``."""
    if not isinstance(counts, dict) or not {"ready", "started", "processed", "completed"} <= set(counts):
        return False
    return counts["ready"] == counts["started"] == counts["processed"] == counts["completed"]


def _at_epoch_end(counts: Any) -> bool:
    """An epoch counted ``processed`` and not ``completed``: saved in ``on_train_epoch_end``."""
    if not isinstance(counts, dict) or not {"ready", "started", "processed", "completed"} <= set(counts):
        return False
    return counts["ready"] == counts["started"] == counts["processed"] == counts["completed"] + 1
