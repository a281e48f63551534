"""Clip fractions and approximate KL of the policy update: how far each iteration moves the policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_grpo.callbacks._outputs import check_prefix, num_prompts, step_output

__all__ = ["CLIP_METRICS", "ClipFractionMonitor"]

#: The update statistics :class:`ClipFractionMonitor` can log (keys of ``StepOutput["metrics"]``).
CLIP_METRICS = ("clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl")


class ClipFractionMonitor(Callback):
    r"""Log the clip fractions and the approximate KL of each iteration's policy update under ``<prefix>clip/``.

    The values are the token-weighted means over the iteration's updates that ``GRPOModule`` computes
    (DESIGN.md §3): ``clip_frac`` (tokens where the clipped branch of the surrogate is taken), ``clip_frac_low``
    (A < 0 and ratio < 1 - ε_low), ``clip_frac_high`` (A > 0 and ratio > 1 + ε_high), ``dual_clip_frac`` and
    ``approx_kl`` = mean(old_logp - logp). They are averaged across ranks. With one update per rollout the ratio is
    exactly 1, so all five are 0; they become informative with ``ppo_epochs > 1`` or several mini-batches.

    Args:
        metrics: Which of :data:`CLIP_METRICS` to log. A metric missing from a step's outputs (a subclass's loss
            may not produce it) is skipped.
        prefix: Prepended to every metric name: ``"train/"`` logs ``train/clip/clip_frac``.

    Raises:
        ValueError: If ``metrics`` names a metric outside :data:`CLIP_METRICS`.
        TypeError: If ``prefix`` is not a string.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import ClipFractionMonitor
        >>> monitor = ClipFractionMonitor(metrics=("clip_frac", "approx_kl"))
        >>> trainer = Trainer(callbacks=[monitor], logger=False)
    """

    def __init__(self, metrics: Sequence[str] = CLIP_METRICS, prefix: str = "train/") -> None:
        if isinstance(metrics, str):
            metrics = (metrics,)
        unknown = [name for name in metrics if name not in CLIP_METRICS]
        if unknown:
            allowed = ", ".join(repr(name) for name in CLIP_METRICS)
            raise ValueError(f"ClipFractionMonitor got unknown metrics {unknown}; choose among {allowed}")
        self.metrics = tuple(metrics)
        self.prefix = check_prefix(prefix)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = step_output(outputs, self, ("rollout", "metrics"))
        values = step["metrics"]
        logged = {f"{self.prefix}clip/{name}": values[name] for name in self.metrics if name in values}
        size = num_prompts(step["rollout"], pl_module)
        pl_module.log_dict(logged, on_step=True, on_epoch=False, sync_dist=True, batch_size=size)
