"""Completion lengths and truncation: is the model hitting ``max_new_tokens``?"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_grpo.callbacks._outputs import check_prefix, num_prompts, step_output

__all__ = ["CompletionStats"]


class CompletionStats(Callback):
    r"""Log the lengths of the sampled completions and how many were cut at ``max_new_tokens``.

    Metrics, each under ``<prefix>completion/``:

    * ``length_mean``, ``length_min``, ``length_max``: completion length in tokens (EOS included), the mean averaged
      across ranks, the minimum and maximum taken over all ranks.
    * ``truncated_frac``: fraction of completions without an EOS within ``max_new_tokens`` (``Rollout.truncated``).
      A rising value means the length budget is too small, or the model has started to ramble.
    * ``eos_frac``: fraction that ended with an EOS, ``1 - truncated_frac`` (completions end in no other way).

    Args:
        prefix: Prepended to every metric name: ``"train/"`` logs ``train/completion/length_mean``.

    Raises:
        TypeError: If ``prefix`` is not a string.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import CompletionStats
        >>> trainer = Trainer(callbacks=[CompletionStats()], logger=False)
    """

    def __init__(self, prefix: str = "train/") -> None:
        self.prefix = check_prefix(prefix)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = step_output(outputs, self, ("rollout",))["rollout"]
        lengths = rollout.completion_lengths.float()  # (N,)
        truncated = rollout.truncated.float()  # (N,)
        name = f"{self.prefix}completion/"
        options: dict[str, Any] = {"on_step": True, "on_epoch": False, "sync_dist": True}
        options["batch_size"] = num_prompts(rollout, pl_module)
        pl_module.log(name + "length_mean", lengths.mean(), **options)
        pl_module.log(name + "length_min", lengths.min(), reduce_fx="min", **options)
        pl_module.log(name + "length_max", lengths.max(), reduce_fx="max", **options)
        pl_module.log(name + "truncated_frac", truncated.mean(), **options)
        pl_module.log(name + "eos_frac", 1.0 - truncated.mean(), **options)
