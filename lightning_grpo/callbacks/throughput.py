"""Throughput, phase timings and peak memory of each GRPO iteration, with Lightning's ``Throughput`` meter."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric.utilities.throughput import Throughput, get_available_flops
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_positive_int, check_prefix
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.rollout import Rollout

__all__ = ["TOTALS", "ThroughputMonitor", "peak_memory_mib"]

#: Lightning's names of its running totals -> ours, which say they are totals (``train/total_tokens``).
TOTALS = {"time": "total_time", "batches": "total_batches", "samples": "total_samples", "lengths": "total_tokens"}


@dataclass
class _Meter:
    """Lightning's :class:`~lightning.fabric.utilities.throughput.Throughput` over one stage, with running totals."""

    throughput: Throughput
    started: float = field(default_factory=time.perf_counter)
    completions: int = 0
    tokens: int = 0
    iterations: int = 0

    def start(self) -> None:
        self.throughput.reset()
        self.completions = self.tokens = self.iterations = 0
        self.started = time.perf_counter()

    def update(self, rollout: Rollout, device: torch.device, flops: int | None) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the clock must see the iteration's kernels
        if not len(rollout):  # a rank whose agents made no chat call: no completion, and the meter needs one a batch
            return
        self.completions += len(rollout)
        self.tokens += int(rollout.sampled_mask.sum())
        self.iterations += 1
        self.throughput.update(
            time=time.perf_counter() - self.started,
            batches=self.iterations,
            samples=self.completions,
            lengths=self.tokens,
            flops=flops,
        )

    def metrics(self, stage: str) -> dict[str, float]:
        """``<stage>/<name>``, Lightning's running totals renamed (:data:`TOTALS`)."""
        if not self.iterations:  # nothing counted yet (a rank without rows so far)
            return {}
        return {f"{stage}/{TOTALS.get(k, k)}": float(v) for k, v in self.throughput.compute().items()}


class ThroughputMonitor(Callback):
    r"""Throughput over sampled completions (Lightning's ``Throughput`` meter), plus GRPO's phase timings and memory.

    The meter (:class:`lightning.fabric.utilities.throughput.Throughput`) counts a *batch* as one iteration,
    a *sample* as one sampled completion and an *item* as one token the policy sampled (``Rollout.sampled_mask``;
    tool and environment tokens of multi-turn trajectories are not counted), in training and in validation.
    Measured on rank zero, they go to the loggers (not to the progress bar) under ``train/`` with the iteration's other
    metrics (one ``metrics.csv`` row per iteration), and under ``validate/`` once at the end of each validation. Given
    to the trainer, Lightning's own ``ThroughputMonitor`` takes this one's place (:attr:`replaces`):

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
      ``score``, ``old_logprobs``, ``reference``, ``update``; only those that ran), and ``time/iteration``: the whole
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

    #: Lightning's own monitor, given to the trainer, takes this one's place (``missing_callbacks``).
    replaces: tuple[type[Callback], ...] = (LightningThroughputMonitor,)

    def __init__(self, window_size: int = 10, log_memory: bool = True, prefix: str = "train/") -> None:
        if check_positive_int("window_size", window_size) < 2:
            raise ValueError(f"window_size must be an int >= 2 (a rate needs two points), got {window_size}")
        self.window_size = window_size
        self.log_memory = log_memory
        self.prefix = check_prefix(prefix)
        self._meters: dict[str, _Meter] = {}
        self._iteration_started: float | None = None
        self._validation_started: float | None = None

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        dtype = getattr(getattr(pl_module, "policy", None), "dtype", torch.float32)
        flops = get_available_flops(trainer.strategy.root_device, dtype)
        self._meters = {
            name: _Meter(Throughput(flops, trainer.world_size, self.window_size)) for name in ("train", "validate")
        }

    def _count(self, stage: str, rollout: Rollout, pl_module: LightningModule) -> None:
        flops = getattr(pl_module, "flops_per_batch", None)  # a module may say what an iteration costs
        self._meters[stage].update(rollout, pl_module.device, flops)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._meters["train"].start()

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.log_memory and pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._iteration_started = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = step_output(outputs, self, ("rollout", "loss_mask", "timings", "ppo_epochs"))
        self._log_phases(pl_module, step)
        self._count("train", step["rollout"], pl_module)
        totals = self._meters["train"].metrics("train") if trainer.is_global_zero else {}
        if trainer.world_size > 1:  # rank zero's clock: every rank logs the same values
            totals = trainer.strategy.broadcast(totals, src=0)
        if totals:
            pl_module.log_dict(totals)  # in the iteration's row of the loggers

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation_started = time.perf_counter()
            self._meters["validate"].start()

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self._count("validate", step_output(outputs, self, ("rollout",))["rollout"], pl_module)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the validation's rates and totals (rank zero), and leave its time out of the training rates."""
        if trainer.sanity_checking or self._validation_started is None:
            return
        self._meters["train"].started += time.perf_counter() - self._validation_started
        self._validation_started = None
        if trainer.is_global_zero and self._meters["validate"].iterations:
            for logger in trainer.loggers:
                logger.log_metrics(self._meters["validate"].metrics("validate"), step=trainer.global_step)

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
        if self._iteration_started is not None:
            seconds[f"{self.prefix}time/iteration"] = time.perf_counter() - self._iteration_started
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
