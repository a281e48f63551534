"""What ``lightning-grpo fit`` prints when it ends: where the run's metrics, checkpoint, adapter and reward curve went,
each once, then ``fit: mean reward A -> B over N iterations (S s)``, the line the demo and the examples end with.

:func:`read_rewards`, :func:`summarize` and :func:`reward_line` make that last line wherever it is printed.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from lightning.pytorch import Trainer

from lightning_grpo.callbacks import AdapterExport, RewardCurve
from lightning_grpo.callbacks.reward_curve import matplotlib_installed
from lightning_grpo.extras import install_hint

__all__ = ["curve_path_left_to_summary", "fit_summary", "read_rewards", "reward_line", "summarize"]

_REWARD_KEY = "train/reward_mean"
_NO_CALLBACK = "none (no {name} callback: model.init_args.default_callbacks or trainer.callbacks)"
#: The loggers RewardCurve's ``reward curve: <path>`` line goes to (Lightning's ``rank_zero_info``).
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


def read_rewards(metrics_csv: str | Path) -> list[float]:
    """The per-iteration mean rewards logged in a CSVLogger ``metrics.csv``, in the order of its ``step`` column."""
    by_step: dict[int, float] = {}
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get(_REWARD_KEY):
                by_step[int(row["step"])] = float(row[_REWARD_KEY])
    return [by_step[step] for step in sorted(by_step)]


def summarize(rewards: Sequence[float], fraction: float = 0.1) -> tuple[float, float]:
    """Mean of the first and of the last ``fraction`` of ``rewards`` (at least one value each).

    Example::

        >>> summarize([0.0] * 10 + [1.0] * 10)
        (0.0, 1.0)
    """
    if not rewards:
        raise ValueError("no rewards were logged; did the run complete any iteration?")
    n = max(1, math.floor(len(rewards) * fraction))
    return sum(rewards[:n]) / n, sum(rewards[-n:]) / n


def reward_line(name: str, rewards: Sequence[float], seconds: float | None = None) -> str:
    """``<name>: mean reward A -> B over N iterations (S s)``: A and B the mean of the first and the last tenth.

    Args:
        name: What ran (``fit``, ``demo``, an example's name).
        rewards: One mean reward per GRPO iteration, in order (:func:`read_rewards`).
        seconds: The run's duration; ``None`` leaves ``(S s)`` out.

    Example::

        >>> reward_line("fit", [0.0] * 10 + [1.0] * 10, seconds=61.2)
        'fit: mean reward 0.00 -> 1.00 over 20 iterations (61 s)'
    """
    if not rewards:
        return f"{name}: no mean reward was logged ({_REWARD_KEY}, logged by the GroupRewardStats callback)"
    first, last = summarize(rewards)
    duration = "" if seconds is None else f" ({seconds:.0f} s)"
    iterations = f"{len(rewards)} iteration" + ("" if len(rewards) == 1 else "s")
    return f"{name}: mean reward {first:.2f} -> {last:.2f} over {iterations}{duration}"


def fit_summary(trainer: Trainer, seconds: float | None = None, name: str = "fit") -> str:
    """Where a fit wrote its metrics, checkpoint, adapter and reward curve, one line each (what was not written says
    so), then its :func:`reward_line`.

    Args:
        trainer: The trainer after ``fit``.
        seconds: The run's duration, for the last line.
        name: The last line's first word (``"demo"`` for the demo).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> print(fit_summary(Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)))
        fit ended after 0 steps. Its files:
          metrics:      none (no logger: set trainer.logger, e.g. lightning.pytorch.loggers.CSVLogger)
          checkpoint:   none (checkpointing is off)
          adapter:      none (no AdapterExport callback: model.init_args.default_callbacks or trainer.callbacks)
          reward curve: none (no RewardCurve callback: model.init_args.default_callbacks or trainer.callbacks)
        fit: no mean reward was logged (train/reward_mean, logged by the GroupRewardStats callback)
    """
    lines = [f"fit ended after {trainer.global_step} steps. Its files:"]
    lines += [f"  metrics:      {line}" for line in _metrics(trainer)]
    lines.append(f"  checkpoint:   {_checkpoint(trainer)}")
    lines.append(f"  adapter:      {_adapter(trainer)}")
    lines.append(f"  reward curve: {_curve(trainer)}")
    lines.append(reward_line(name, _rewards(trainer), seconds))
    return "\n".join(lines)


@contextmanager
def curve_path_left_to_summary() -> Iterator[None]:
    """Drop RewardCurve's own ``reward curve: <path>`` line while a command-line fit runs: :func:`fit_summary` names
    the path at the end, beside the others. Its ``reward curve: off (...)`` line at the start of fit stays."""
    loggers = [logging.getLogger(name) for name in _RANK_ZERO_LOGGERS]
    for logger in loggers:
        logger.addFilter(_drop_curve_path)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_drop_curve_path)


def _drop_curve_path(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("reward curve: ") and not message.startswith("reward curve: off"))


def _metrics(trainer: Trainer) -> list[str]:
    """A line per logger: its ``metrics.csv`` when it wrote one, else its folder."""
    lines = []
    for logger in trainer.loggers:
        folder = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
        if folder is None:
            lines.append(type(logger).__name__)
            continue
        path = Path(folder) / "metrics.csv"
        lines.append(f"{path if path.exists() else folder} ({type(logger).__name__})")
    return lines or ["none (no logger: set trainer.logger, e.g. lightning.pytorch.loggers.CSVLogger)"]


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


def _adapter(trainer: Trainer) -> str:
    """The final adapter export, or why there is none."""
    exports = [callback for callback in trainer.callbacks if isinstance(callback, AdapterExport)]
    if not exports:
        return _NO_CALLBACK.format(name="AdapterExport")
    final = exports[0].path_for(trainer, "final")
    return f"{final}" + ("" if final.exists() else " (not written)")


def _curve(trainer: Trainer) -> str:
    """The reward curve's picture, or why none was drawn."""
    curves = [callback for callback in trainer.callbacks if isinstance(callback, RewardCurve)]
    if not curves:
        return _NO_CALLBACK.format(name="RewardCurve")
    if curves[0].path is not None:
        return str(curves[0].path)
    if not matplotlib_installed():
        return f"none (matplotlib is not installed: {install_hint('plot')})"
    if not curves[0].rewards:
        return "none (no reward was logged)"
    return "none (no run folder: set trainer.logger or trainer.default_root_dir)"


def _rewards(trainer: Trainer) -> list[float]:
    """The run's mean reward per iteration: from a logger's ``metrics.csv`` (as the demo reads it), else from the
    RewardCurve callback (which a checkpoint restores, so a resumed run counts from its start)."""
    for logger in trainer.loggers:
        folder = getattr(logger, "log_dir", None)
        path = Path(folder) / "metrics.csv" if folder else None
        if path is not None and path.is_file() and (rewards := read_rewards(path)):
            return rewards
    curves = [callback for callback in trainer.callbacks if isinstance(callback, RewardCurve)]
    return [curves[0].rewards[i] for i in sorted(curves[0].rewards)] if curves else []
