"""Sample completions with their rewards and advantages, sent to the loggers and the console now and then."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_positive_int
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.callbacks.iteration_counter import IterationCounter

__all__ = ["SampleLogger", "conversation_text", "markdown_table"]

COLUMNS = ("step", "prompt", "completion", "reward", "advantage")


class SampleLogger(IterationCounter):
    r"""Every ``every_n_iterations`` iterations, send a table of sample completions to the loggers that can show one.

    The table holds the first ``num_samples`` rows of the rank-zero rollout (samples of a group are consecutive, so
    with ``num_samples <= G`` it shows one prompt's group side by side) with columns ``step``, ``prompt``,
    ``completion``, ``reward`` (NaN where every reward function skipped the row) and ``advantage`` (for token-level
    advantages, the mean over the row's sampled tokens: tool and environment tokens, which carry none, are left out).
    Conversational prompts and multi-turn completions (lists of chat messages) are shown whole, one message per line
    with its role, tool calls included (:func:`conversation_text`).
    It goes, on rank zero only, to:

    * a logger with a ``log_table`` method (``WandbLogger``): ``log_table(key, columns, data, step)``;
    * a ``CSVLogger``: rows appended to ``samples.csv`` in its ``log_dir``, full texts;
    * a logger whose ``experiment`` has ``add_text`` (``TensorBoardLogger``): a Markdown table under ``key``;
    * the console, through ``rank_zero_info``, with texts cut to ``max_chars``.

    Iterations are counted as ``training_step`` calls, and the count is saved in checkpoints so a resumed run keeps
    the rhythm. ``step`` is the logger step Lightning logs that iteration's metrics at (the ``step`` column of
    ``metrics.csv``: the iteration count from 0, one per ``training_step``), so a table lines up with the reward
    curves. It is not ``trainer.global_step``, which counts optimizer steps, of which one iteration may take several
    (docs/glossary.md).

    Args:
        every_n_iterations: Log after every this many iterations (the n-th, 2n-th, ...).
        num_samples: Rows per table (fewer if the rollout is smaller).
        max_chars: Longest text shown on the console (and in the Markdown table); longer ones end in ``...``.
        console: Also print the table on the console.
        key: Name of the table for the loggers.

    Raises:
        ValueError: If ``every_n_iterations``, ``num_samples`` or ``max_chars`` is not an int >= 1.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import SampleLogger
        >>> samples = SampleLogger(every_n_iterations=10, num_samples=4)
        >>> trainer = Trainer(callbacks=[samples], logger=False)
    """

    def __init__(
        self,
        every_n_iterations: int = 50,
        num_samples: int = 4,
        max_chars: int = 200,
        console: bool = True,
        key: str = "train/samples",
    ) -> None:
        self.every_n_iterations = check_positive_int("every_n_iterations", every_n_iterations)
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.max_chars = check_positive_int("max_chars", max_chars)
        self.console = console
        self.key = key
        super().__init__()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.iterations += 1
        if self.iterations % self.every_n_iterations or not trainer.is_global_zero:
            return
        step = self.iterations - 1  # where Lightning logs this iteration's metrics: one logger step per training_step
        rows = sample_rows(step_output(outputs, self, ("rollout", "rewards", "advantages")), self.num_samples)
        data = [[step, *row] for row in rows]
        for logger in trainer.loggers:
            self._send(logger, data, step)
        if self.console:
            table = markdown_table(COLUMNS, data, max_chars=self.max_chars)
            rank_zero_info(f"Samples of iteration {step} (global_step {trainer.global_step}):\n{table}")

    def _send(self, logger: Logger, data: list[list[Any]], step: int) -> None:
        """Send the table to one logger, in the form it supports; other loggers are skipped."""
        if callable(getattr(logger, "log_table", None)):
            logger.log_table(key=self.key, columns=list(COLUMNS), data=data, step=step)
        elif isinstance(logger, CSVLogger):
            append_csv(Path(logger.log_dir) / "samples.csv", COLUMNS, data)
        elif callable(getattr(getattr(logger, "experiment", None), "add_text", None)):
            logger.experiment.add_text(self.key, markdown_table(COLUMNS, data, self.max_chars), global_step=step)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(key=self.key, every_n_iterations=self.every_n_iterations)


def sample_rows(step: Mapping[str, Any], num_samples: int) -> list[list[Any]]:
    """``[prompt, completion, reward, advantage]`` for the first ``num_samples`` rows of an iteration's output."""
    rollout, advantages = step["rollout"], step["advantages"]
    n = min(num_samples, len(rollout))
    if advantages.dim() == 2:  # (N, T): the mean over each row's sampled tokens (not the inserted ones)
        mask = (rollout.sampled_mask[:n] * rollout.completion_mask[:n]).to(advantages.dtype)
        advantages = (advantages[:n] * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    rewards = step["rewards"].rewards[:n].float().tolist()
    advantages = advantages[:n].float().tolist()
    return [
        [conversation_text(rollout.prompts[i]), conversation_text(rollout.completions[i]), rewards[i], advantages[i]]
        for i in range(n)
    ]


def conversation_text(value: Any) -> Any:
    r"""A list of chat messages as text, one ``[role] content`` line per message; anything else unchanged.

    Tool calls of assistant messages follow their content as ``name(arguments)``.

    Example::

        >>> call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
        >>> print(conversation_text([
        ...     {"role": "assistant", "content": "", "tool_calls": [call]},
        ...     {"role": "tool", "name": "add", "content": "5"},
        ...     {"role": "assistant", "content": "5"},
        ... ]))
        [assistant] add({"a": 2, "b": 3})
        [tool] 5
        [assistant] 5
    """
    if not isinstance(value, list | tuple) or not all(isinstance(m, Mapping) for m in value):
        return value
    return "\n".join(_message_text(message) for message in value)


def _message_text(message: Mapping[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        parts.append(f"{function.get('name', '?')}({arguments})")
    return f"[{message.get('role', '?')}] " + " ".join(part for part in parts if part)


def append_csv(path: Path, columns: Sequence[str], data: list[list[Any]]) -> None:
    """Append ``data`` to the CSV file ``path``, writing the header first when the file is new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        if new:
            writer.writerow(columns)
        writer.writerows(data)


def markdown_table(columns: Sequence[str], data: list[list[Any]], max_chars: int | None = None) -> str:
    r"""A Markdown table of ``data``; floats with 4 decimals, texts on one line and cut to ``max_chars``.

    Example::

        >>> print(markdown_table(["prompt", "reward"], [["1+1=", 1.0], ["a|b\nc", float("nan")]]))
        | prompt | reward |
        | --- | --- |
        | 1+1= | 1.0000 |
        | a\|b↵c | nan |
    """
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    lines += ["| " + " | ".join(_cell(value, max_chars) for value in row) + " |" for row in data]
    return "\n".join(lines)


def _cell(value: Any, max_chars: int | None) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    text = str(value)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + "..."
    return text.replace("\r", "").replace("\n", "↵").replace("|", "\\|")
