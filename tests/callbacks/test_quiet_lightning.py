"""Lightning's lines that say nothing about a GRPO fit are dropped; its model summary is one line (PolicySummary)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

import lightning_grpo.callbacks  # noqa: F401 - installs the filters
from tests.conftest import make_trainer, prompt_loader

NOISE = ("Seed set to", "GPU available: False", "TPU available: False", "FLOPs", "`weights_only` was not set")


@contextlib.contextmanager
def lightning_lines() -> Iterator[list[str]]:
    """What Lightning's loggers pass on while the block runs (after their filters), and the warnings shown."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    names = ("lightning.pytorch", "lightning.fabric")
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            import lightning_grpo.callbacks._quiet_lightning as quiet

            quiet.install()  # catch_warnings reset the filters: install them again inside
            yield lines
        lines.extend(str(warning.message) for warning in caught)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def test_a_fit_without_validation_prints_none_of_lightnings_empty_lines(make_module, tmp_path):
    from lightning.fabric.utilities.seed import seed_everything

    with lightning_lines() as lines:
        seed_everything(3)
        trainer = make_trainer(
            max_steps=1, enable_model_summary=None, enable_checkpointing=True, default_root_dir=tmp_path
        )
        trainer.fit(make_module(), prompt_loader(["1+1=", "2+2="]))
    shown = "\n".join(lines)
    assert not [noise for noise in NOISE if noise in shown], shown
    assert "across ranks is zero" not in shown and "LeafSpec" not in shown
    assert any(line.startswith("model: ") and "trainable parameters (the LoRA adapter) of" in line for line in lines)
