"""Prompt data: sources (JSONL, JSON, lists, Hugging Face datasets), built-in tiny tasks and the DataModule.

Example::

    from lightning_grpo.data import PromptDataModule, load_records, make_task

    records = make_task("addition", num_samples=8)
    dm = PromptDataModule(records, batch_size=4)
"""

from __future__ import annotations

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.sources import load_records
from lightning_grpo.data.tasks import BUILTIN_TASKS, make_task

__all__ = ["BUILTIN_TASKS", "PromptDataModule", "load_records", "make_task"]
