"""Throughput, phase timings and peak memory of each GRPO iteration, on Lightning's ``ThroughputMonitor``."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_positive_int, check_prefix
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.rollout import Rollout

__all__ = ["TOTALS", "ThroughputMonitor", "peak_memory_mib"]

#: Lightning's names of its running totals -> ours, which say they are totals (``train/total_tokens``).
TOTALS = {"time": "total_time", "batches": "total_batches", "samples": "total_samples", "lengths": "total_tokens"}


class ThroughputMonitor(LightningThroughputMonitor):
    r"""Lightning's ``ThroughputMonitor`` over sampled completions, plus the phase timings and memory of GRPO.

    Lightning's part (:class:`lightning.fabric.utilities.throughput.Throughput`) counts a *batch* as one iteration,
    a *sample* as one sampled completion and an *item* as one token the policy sampled (``Rollout.sampled_mask``;
    tool and environment tokens of multi-turn trajectories are not counted), in training and in validation.
    On rank zero, at the trainer's logging steps, it sends to the loggers (not to the progress bar) under ``train/``
    (``validate/`` for validation), in training with the step's other metrics (one ``metrics.csv`` row per step):

    * ``device/samples_per_sec``, ``device/items_per_sec``, ``device/batches_per_sec``: completions, completion
      tokens and iterations per second of wall-clock time on rank zero, averaged over the last ``window_size``
      iterations (so they appear from the ``window_size``-th iteration on; validation time is left out of training);
    * with several devices, ``samples_per_sec``, ``items_per_sec``, ``batches_per_sec``: the same times the world size;
    * ``total_time``, ``total_batches``, ``total_samples``, ``total_tokens``: running totals since the start of
      the stage (seconds, iterations, completions, sampled tokens; Lightning's ``time``, ``batches``, ``samples``,
      ``lengths``, renamed to say they are totals);
    * ``device/flops_per_sec`` and ``device/mfu`` when the module sets ``flops_per_batch``.

    GRPO's part, logged by every rank with ``pl_module.log`` as global values (:mod:`lightning_grpo.metrics`), each
    under ``prefix``:

    * ``throughput/generated_tokens_per_sec``: valid completion tokens over the seconds of the ``generate`` phase,
      summed across ranks (the sampling rate of the job).
    * ``throughput/trained_tokens_per_sec``: loss tokens (``loss_mask``) times ``ppo_epochs`` over the seconds of the
      ``update`` phase, summed across ranks.
    * ``time/<phase>``: seconds of each phase ``GRPOModule`` timed (``sync``: the backend's weight sync, ``generate``,
      ``score``, ``old_logprobs``, ``reference``, ``update``; only those that ran), and ``time/step``: the whole
      ``training_step`` as seen from the batch-start and batch-end hooks. The maximum across ranks: the slowest rank
      sets the pace.
    * ``memory/peak_mib``: peak memory in MiB, the maximum across ranks. On CUDA, the peak allocated by tensors in
      this iteration (``torch.cuda.max_memory_allocated``, reset at each batch start); on CPU, the peak resident set
      size of the process since it started (``ru_maxrss``; it cannot be reset).

    Args:
        window_size: Iterations in Lightning's rolling average (at least 2).
        log_memory: Log ``memory/peak_mib``.
        prefix: Prepended to the names of GRPO's part.

    Raises:
        ValueError: If ``window_size`` is not an int >= 2.
        TypeError: If ``prefix`` is not a string.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import ThroughputMonitor
        >>> trainer = Trainer(callbacks=[ThroughputMonitor(window_size=5, log_memory=False)], logger=False)
    """

    def __init__(self, window_size: int = 10, log_memory: bool = True, prefix: str = "train/") -> None:
        if check_positive_int("window_size", window_size) < 2:
            raise ValueError(f"window_size must be an int >= 2 (a rate needs two points), got {window_size}")
        super().__init__(batch_size_fn=self._completions, length_fn=self._completion_tokens, window_size=window_size)
        self.log_memory = log_memory
        self.prefix = check_prefix(prefix)
        self._rollout: Rollout | None = None
        self._step_started: float | None = None
        self._pending: dict[str, Any] = {}  # Lightning's training part, logged with the step's other metrics

    def _completions(self, batch: Any) -> int:
        """Lightning's ``batch_size_fn``: the samples of the step are the completions of its rollout."""
        return len(self._latest_rollout())

    def _completion_tokens(self, batch: Any) -> int:
        """Lightning's ``length_fn``: the items of the step are the tokens the policy sampled in its rollout."""
        return int(self._latest_rollout().sampled_mask.sum())

    def _latest_rollout(self) -> Rollout:
        if self._rollout is None:
            raise TypeError("ThroughputMonitor counts the rollout of GRPOModule's training and validation steps")
        return self._rollout

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.log_memory and pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._step_started = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = step_output(outputs, self, ("rollout", "loss_mask", "timings", "ppo_epochs"))
        self._rollout = step["rollout"]
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # Lightning's part, rank zero
        self._log_phases(pl_module, step)
        if trainer.world_size > 1:  # rank zero measured them: every rank logs the same values
            self._pending = trainer.strategy.broadcast(self._pending, src=0)
        if self._pending:  # in the step's row of the loggers (a logger call of its own would add a second row)
            pl_module.log_dict(self._pending)
            self._pending = {}

    @override
    def _compute(self, trainer: Trainer, iter_num: int | None = None) -> None:
        """Lightning's, with the totals named as such; in training kept for ``pl_module.log_dict`` in the step's row."""
        stage = trainer.state.stage
        if stage is None or (stage != RunningStage.TRAINING and not trainer._logger_connector.should_update_logs):
            return
        throughput = self._throughputs[stage]  # Lightning's own state, filled by its on_*_batch_end
        prefix = f"{stage.value}{throughput.separator}"
        metrics = {f"{prefix}{TOTALS.get(k, k)}": v for k, v in throughput.compute().items()}
        if stage != RunningStage.TRAINING:
            trainer._logger_connector.log_metrics(metrics, step=iter_num)  # as Lightning's own _compute
            return
        self._pending = {name: float(value) for name, value in metrics.items()}

    @override
    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if not trainer.sanity_checking:
            self._rollout = step_output(outputs, self, ("rollout",))["rollout"]
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def _log_phases(self, pl_module: LightningModule, step: Any) -> None:
        """Token rates per phase (summed across ranks), phase seconds and peak memory (maxima across ranks)."""
        rollout, timings, device = step["rollout"], step["timings"], pl_module.device
        tokens = {
            "generated": (rollout.sampled_mask.sum(), "generate"),  # not tool or environment tokens
            "trained": (step["loss_mask"].sum() * step["ppo_epochs"], "update"),
        }
        rates = {
            f"{self.prefix}throughput/{name}_tokens_per_sec": count.double() / timings[phase]
            for name, (count, phase) in tokens.items()
            if timings.get(phase, 0.0) > 0  # a subclass may skip or not time a phase
        }
        seconds = {f"{self.prefix}time/{phase}": value for phase, value in timings.items()}
        if self._step_started is not None:
            seconds[f"{self.prefix}time/step"] = time.perf_counter() - self._step_started
        if self.log_memory:
            seconds[f"{self.prefix}memory/peak_mib"] = peak_memory_mib(device)
        maxima = torch.tensor(list(seconds.values()), dtype=torch.float64, device=device)
        logged = dict(zip(seconds, reduce_across_ranks(maxima, "max"), strict=True))
        if rates:
            logged.update(zip(rates, reduce_across_ranks(torch.stack(list(rates.values()))), strict=True))
        pl_module.log_dict({name: value.float() for name, value in logged.items()})  # already global


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory in MiB: tensors allocated on a CUDA ``device`` since the last reset, else the process's peak RSS.

    Example::

        >>> peak_memory_mib(torch.device("cpu")) > 0
        True
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return getattr(info, "peak_wset", info.rss) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
