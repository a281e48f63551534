"""Completion lengths and truncation: is the model hitting ``max_new_tokens``?"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_prefix
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.metrics import reduce_across_ranks

__all__ = ["CompletionStats"]


class CompletionStats(Callback):
    r"""Log the lengths of the sampled completions and how many were cut at ``max_new_tokens``.

    Metrics, each under ``<prefix>completion/``:

    * ``length_mean``, ``length_min``, ``length_max``: completion length in tokens (EOS included) over the
      completions of all ranks.
    * ``truncated_frac``: fraction of completions without an EOS within ``max_new_tokens`` (``Rollout.truncated``).
      A rising value means the length budget is too small, or the model has started to ramble.
    * ``eos_frac``: fraction that ended with an EOS, ``1 - truncated_frac`` (completions end in no other way).

    Every value is global: sums, minimum and maximum are reduced across ranks by :mod:`lightning_grpo.metrics`.

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
        lengths, truncated = rollout.completion_lengths.double(), rollout.truncated.double()  # (N,), (N,)
        local = torch.stack([torch.ones_like(lengths).sum(), lengths.sum(), truncated.sum()])
        count, total, cut = reduce_across_ranks(local)
        none = lengths.new_tensor([float("-inf")] * 2)  # a rank without rows (its agents made no chat call)
        extremes = torch.stack([-lengths.min(), lengths.max()]) if len(lengths) else none
        negative_min, length_max = reduce_across_ranks(extremes, "max")
        metrics = {
            "length_mean": total / count,
            "length_min": -negative_min,
            "length_max": length_max,
            "truncated_frac": cut / count,
            "eos_frac": 1.0 - cut / count,
        }
        prefix = f"{self.prefix}completion/"
        pl_module.log_dict({prefix + key: value.float() for key, value in metrics.items()})  # already global
