"""The lines ``lightning-grpo fit`` prints when it ends: where the run's metrics, checkpoints and adapter went."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Trainer

from lightning_grpo.callbacks import AdapterExport

__all__ = ["fit_summary"]


def fit_summary(trainer: Trainer) -> str:
    """Where a fit wrote its metrics, checkpoint and adapter, one line each (what was not written says so).

    Args:
        trainer: The trainer after ``fit``.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> print(fit_summary(Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)))
        fit ended after 0 steps. Its files:
          metrics:    none (no logger: set trainer.logger, e.g. lightning.pytorch.loggers.CSVLogger)
          checkpoint: none (checkpointing is off)
          adapter:    none (no AdapterExport callback: model.init_args.default_callbacks or trainer.callbacks)
    """
    lines = [f"fit ended after {trainer.global_step} steps. Its files:", *_metrics(trainer)]
    lines.append(f"  checkpoint: {_checkpoint(trainer)}")
    exports = [callback for callback in trainer.callbacks if isinstance(callback, AdapterExport)]
    if exports:
        final = exports[0].path_for(trainer, "final")
        lines.append(f"  adapter:    {final}" + ("" if final.exists() else " (not written)"))
    else:
        lines.append(
            "  adapter:    none (no AdapterExport callback: model.init_args.default_callbacks or trainer.callbacks)"
        )
    return "\n".join(lines)


def _metrics(trainer: Trainer) -> list[str]:
    """A line per logger: its ``metrics.csv`` when it wrote one, else its folder."""
    lines = []
    for logger in trainer.loggers:
        folder = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
        if folder is None:
            lines.append(f"  metrics:    {type(logger).__name__}")
            continue
        csv = Path(folder) / "metrics.csv"
        lines.append(f"  metrics:    {csv if csv.exists() else folder} ({type(logger).__name__})")
    return lines or ["  metrics:    none (no logger: set trainer.logger, e.g. lightning.pytorch.loggers.CSVLogger)"]


def _checkpoint(trainer: Trainer) -> str:
    """The last checkpoint file written, or the folder checkpoints go to, or why there is none."""
    callback = trainer.checkpoint_callback
    if callback is None:
        return "none (checkpointing is off)"
    written = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
    if written:
        return str(written)
    folder = getattr(callback, "dirpath", None)
    return f"none written yet (they go to {folder})" if folder else "none written"
