"""Shared by the callback tests: a short fit that records every step's outputs and the metrics logged in it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import Logger

from lightning_grpo import GRPOModule
from tests.conftest import make_trainer, prompt_loader

PROMPTS = ("1+1=", "2+2=")


def first_char_code(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """A reward that varies within groups even for an untrained model: the first character's code modulo 5."""
    return [float(ord(c[0]) % 5) if c else 0.0 for c in completions]


class Recorder(Callback):
    """Keeps each step's ``outputs`` and a copy of ``trainer.callback_metrics`` after the callbacks before it ran."""

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []
        self.metrics: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.outputs.append(outputs)
        self.metrics.append({name: value.clone() for name, value in trainer.callback_metrics.items()})


class ListLogger(Logger):
    """A logger that keeps what it is sent in lists (``log_metrics`` calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[dict[str, float], int]] = []

    @property
    def name(self) -> str:
        return "list"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((dict(metrics), step))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def fit(
    module: GRPOModule, callbacks: Sequence[Callback], *, iterations: int = 2, prompts: Sequence[str] = PROMPTS,
    **trainer_kwargs: Any,
) -> tuple[Trainer, Recorder]:  # fmt: skip
    """Fit ``module`` for ``iterations`` training steps (GRPO iterations, whatever the optimizer steps per step)."""
    recorder = Recorder()
    module.use_default_callbacks = False  # exactly the callbacks under test (the module adds the monitoring set)
    options = {"max_epochs": 1, "log_every_n_steps": 1, **trainer_kwargs}
    trainer = make_trainer(callbacks=[*callbacks, recorder], **options)
    trainer.fit(module, train_dataloaders=prompt_loader(list(prompts), repeat=iterations))
    assert len(recorder.outputs) == iterations
    return trainer, recorder
