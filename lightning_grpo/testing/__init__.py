"""Test fixtures: a tiny model and tokenizer built in code, tiny tasks, and their data module.

Nothing here is needed to train real models, and no module of the package imports it. Use it in tests and examples,
or in YAML configs by ``class_path`` (``lightning_grpo.testing.TinyModel``, ``lightning_grpo.testing.TinyTokenizer``,
``lightning_grpo.testing.TinyTaskDataModule``; ``TinyToolModel`` and ``TinyToolTokenizer``: a tiny policy that
calls a tool), as the demo's config does (``lightning_grpo/demo/tiny.yaml``; the
demo itself is :mod:`lightning_grpo.demo`).

Example::

    from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer, make_task

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)  # random weights; TinyModel("addition") is warmed up on the task
    records = make_task("addition", num_samples=8)
"""

from __future__ import annotations

from lightning_grpo.testing.task_datamodule import TinyTaskDataModule
from lightning_grpo.testing.tasks import BUILTIN_TASKS, addition, make_task, successor
from lightning_grpo.testing.tiny_model import (
    RANDOM,
    TinyModel,
    WarmupSettings,
    build_tiny_model,
    load_tiny_model,
    tiny_cache_dir,
    tiny_config,
    warm_up,
)
from lightning_grpo.testing.tokenizer import ALPHABET, TinyTokenizer, TinyToolTokenizer, build_tiny_tokenizer
from lightning_grpo.testing.tool_model import TinyToolModel

__all__ = [
    "ALPHABET",
    "BUILTIN_TASKS",
    "RANDOM",
    "TinyModel",
    "TinyTaskDataModule",
    "TinyTokenizer",
    "TinyToolModel",
    "TinyToolTokenizer",
    "WarmupSettings",
    "addition",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "load_tiny_model",
    "make_task",
    "successor",
    "tiny_cache_dir",
    "tiny_config",
    "warm_up",
]
