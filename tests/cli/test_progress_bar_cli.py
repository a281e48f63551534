"""The CLI uses GRPOProgressBar by default: short names, ``Epoch N`` for ``max_steps`` runs (docs/callbacks.md)."""

from __future__ import annotations

from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

from lightning_grpo.callbacks import GRPOProgressBar
from lightning_grpo.cli import GRPOCLI
from tests.cli.conftest import TINY


def _bars(args: list[str]) -> list[ProgressBar]:
    cli = GRPOCLI(args=["--config", str(TINY), "--trainer.logger=false", "--trainer.max_steps=1", *args], run=False)
    return [callback for callback in cli.trainer.callbacks if isinstance(callback, ProgressBar)]


def test_the_cli_shows_grpo_progress_bar_by_default():
    (bar,) = _bars(["--trainer.enable_progress_bar=true"])
    assert isinstance(bar, GRPOProgressBar)


def test_a_disabled_or_configured_bar_is_respected():
    assert _bars(["--trainer.enable_progress_bar=false"]) == []
    (bar,) = _bars(["--trainer.enable_progress_bar=true", "--trainer.callbacks+=TQDMProgressBar"])
    assert type(bar) is TQDMProgressBar
