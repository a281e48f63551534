"""``TinyTaskDataModule``: the prompts of a built-in tiny task as a :class:`~lightning_grpo.data.PromptDataModule`.

In a YAML config::

    data:
      class_path: lightning_grpo.testing.TinyTaskDataModule
      init_args: {task: addition, batch_size: 8}
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.data import PromptDataModule
from lightning_grpo.testing.tasks import make_task

__all__ = ["TinyTaskDataModule"]


class TinyTaskDataModule(PromptDataModule):
    """A :class:`~lightning_grpo.data.PromptDataModule` over the records of a built-in task.

    Args:
        task: A key of :data:`~lightning_grpo.testing.BUILTIN_TASKS` (``"addition"``, ``"successor"``).
        task_args: Keyword arguments of the task's function, e.g. ``{"num_samples": 64, "seed": 1}``.
        val_task_args: Arguments of a second draw of the task used as validation data; ``None`` for none (or
            hold out a fraction of the training records with ``val_split``).
        **kwargs: The other arguments of :class:`~lightning_grpo.data.PromptDataModule` (``batch_size``,
            ``val_split``, ``max_prompt_length``, ...).

    Raises:
        ValueError: ``task`` is not a built-in task (the message lists them) or a task argument is invalid.

    Example::

        >>> dm = TinyTaskDataModule("addition", task_args={"num_samples": 16}, batch_size=4)
        >>> dm.setup("fit")
        >>> sorted(next(iter(dm.train_dataloader())))
        ['answer', 'dataset_index', 'prompt']
    """

    def __init__(
        self,
        task: str = "addition",
        task_args: dict[str, Any] | None = None,
        val_task_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        train = make_task(task, **(task_args or {}))
        val = None if val_task_args is None else make_task(task, **val_task_args)
        super().__init__(train, val, **kwargs)
        self.task, self.task_args, self.val_task_args = task, task_args, val_task_args
