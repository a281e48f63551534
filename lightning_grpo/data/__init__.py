"""Prompt data: sources (JSONL, JSON, lists, Hugging Face datasets) and the DataModule.

Example::

    from lightning_grpo.data import PromptDataModule, load_records

    records = load_records([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}])
    dm = PromptDataModule(records, batch_size=2)
"""

from __future__ import annotations

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.sources import MissingDataError, load_records

__all__ = ["MissingDataError", "PromptDataModule", "load_records"]
