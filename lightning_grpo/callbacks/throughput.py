"""Throughput, phase timings and peak memory of each GRPO iteration."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_grpo.callbacks._outputs import check_prefix, num_prompts, step_output

__all__ = ["ThroughputMonitor", "peak_memory_mib"]


class ThroughputMonitor(Callback):
    r"""Log tokens per second, the seconds of each phase of the iteration, and peak memory.

    Metrics, each under ``prefix``:

    * ``throughput/generated_tokens_per_sec``: valid completion tokens (``Rollout.completion_mask``) over the seconds
      of the ``generate`` phase, summed across ranks (the job's rate).
    * ``throughput/trained_tokens_per_sec``: loss tokens (``loss_mask``) times ``ppo_epochs`` over the seconds of the
      ``update`` phase, summed across ranks.
    * ``time/<phase>``: seconds of each phase ``GRPOModule`` timed (``generate``, ``score``, ``old_logprobs``,
      ``reference``, ``update``; only those that ran), and ``time/step``: the whole ``training_step`` as seen from
      the batch-start and batch-end hooks. The maximum across ranks: the slowest rank sets the pace.
    * ``memory/peak_mib``: peak memory in MiB, the maximum across ranks. On CUDA, the peak allocated by tensors in
      this iteration (``torch.cuda.max_memory_allocated``, reset at each batch start); on CPU, the peak resident set
      size of the process since it started (``ru_maxrss``; it cannot be reset).

    Args:
        log_memory: Log ``memory/peak_mib``.
        prefix: Prepended to every metric name.

    Raises:
        TypeError: If ``prefix`` is not a string.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import ThroughputMonitor
        >>> trainer = Trainer(callbacks=[ThroughputMonitor(log_memory=False)], logger=False)
    """

    def __init__(self, log_memory: bool = True, prefix: str = "train/") -> None:
        self.log_memory = log_memory
        self.prefix = check_prefix(prefix)
        self._start: float | None = None

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.log_memory and pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._start = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = step_output(outputs, self, ("rollout", "loss_mask", "timings"))
        rollout, timings = step["rollout"], step["timings"]
        options: dict[str, Any] = {"on_step": True, "on_epoch": False, "sync_dist": True}
        options["batch_size"] = num_prompts(rollout, pl_module)
        epochs = getattr(getattr(pl_module, "config", None), "ppo_epochs", 1)
        tokens = {
            "generated": (rollout.completion_mask.sum(), "generate"),
            "trained": (step["loss_mask"].sum() * epochs, "update"),
        }
        rates = {
            f"{self.prefix}throughput/{name}_tokens_per_sec": count.float() / timings[phase]
            for name, (count, phase) in tokens.items()
            if timings.get(phase, 0.0) > 0  # a subclass may skip or not time a phase
        }
        pl_module.log_dict(rates, reduce_fx="sum", **options)
        seconds = dict(timings)
        if self._start is not None:
            seconds["step"] = time.perf_counter() - self._start
        device = pl_module.device
        times = {f"{self.prefix}time/{phase}": torch.tensor(s, device=device) for phase, s in seconds.items()}
        pl_module.log_dict(times, reduce_fx="max", **options)
        if self.log_memory:
            peak = torch.tensor(peak_memory_mib(device), device=device)
            pl_module.log(f"{self.prefix}memory/peak_mib", peak, reduce_fx="max", **options)


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
