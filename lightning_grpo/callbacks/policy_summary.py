"""The model summary of a LoRA policy in one line, in place of Lightning's default table (docs/callbacks.md)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelSummary, RichModelSummary
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import get_human_readable_count
from typing_extensions import override

__all__ = ["PolicySummary", "one_line_summary"]


class PolicySummary(ModelSummary):
    """One line, ``model: 1.2 K trainable parameters (the LoRA adapter) of 50.3 K in all``, at the start of fit.

    Lightning's summary of a ``GRPOModule`` is a table of one row (the ``PeftModel``) whose FLOPs are 0: this says
    what it says in one line. ``GRPOModule`` puts it in place of Lightning's own summary (:func:`one_line_summary`);
    a ``ModelSummary`` or ``RichModelSummary`` you give the ``Trainer`` yourself draws its table.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[PolicySummary()], logger=False)
    """

    @override
    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        trainable, total = (get_human_readable_count(n) for n in (trainable_parameters, total_parameters))
        rank_zero_info(f"model: {trainable} trainable parameters (the LoRA adapter) of {total} in all")


def one_line_summary(trainer: Trainer) -> list[PolicySummary]:
    """A :class:`PolicySummary` in place of Lightning's own model summary, taken out of ``trainer.callbacks``; none
    when the trainer has no summary (``enable_model_summary=False``) or one of the user's.

    Lightning keeps no record of whether it added the summary itself (``enable_model_summary`` left out, or
    ``True``: the same) or the user passed it, so Lightning's is told by what only it has in common: Lightning's class
    (``RichModelSummary`` with ``rich`` installed, else ``ModelSummary``) with its default settings, after every
    other callback but the checkpoints (Lightning appends it to the user's callbacks, then moves checkpoints last).
    A summary passed with a setting of its own (``ModelSummary(max_depth=2)``), or before another callback, stays.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.callbacks import ModelSummary
        >>> trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        >>> [type(callback).__name__ for callback in one_line_summary(trainer)]
        ['PolicySummary']
        >>> [type(callback).__name__ for callback in trainer.callbacks]
        []
        >>> mine = Trainer(logger=False, callbacks=[ModelSummary(max_depth=2)])
        >>> one_line_summary(mine), any(isinstance(callback, ModelSummary) for callback in mine.callbacks)
        ([], True)
    """
    summaries = [callback for callback in trainer.callbacks if isinstance(callback, ModelSummary)]
    if len(summaries) != 1 or not _is_lightning_default(summaries[0], trainer.callbacks):
        return []
    trainer.callbacks = [callback for callback in trainer.callbacks if callback is not summaries[0]]
    return [PolicySummary()]


def _is_lightning_default(summary: ModelSummary, callbacks: list[Callback]) -> bool:
    """Whether ``summary`` is the one Lightning adds by itself: its class, default settings, last but checkpoints."""
    if type(summary) is not _lightning_class() or vars(summary) != vars(type(summary)()):
        return False
    after = callbacks[callbacks.index(summary) + 1 :]
    return all(isinstance(callback, Checkpoint) for callback in after)


def _lightning_class() -> type[ModelSummary]:
    """The summary class Lightning adds: ``RichModelSummary`` where ``rich`` is installed, else ``ModelSummary``."""
    try:
        RichModelSummary()  # refuses to be built without rich, as Lightning's own check does
    except ModuleNotFoundError:
        return ModelSummary
    return RichModelSummary
