"""The policy-update pass: ``ppo_epochs`` over shuffled mini-batches, micro-batch backward, metric sums.

:meth:`GRPOModule.update_policy <lightning_grpo.module.GRPOModule.update_policy>` calls :func:`run_updates`; the
loss of each micro-batch still comes from the module's overridable ``compute_loss`` (docs/index.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from lightning_grpo import distributed
from lightning_grpo.algorithms.statistics import SumAcrossRanks
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.rollout import Rollout
from lightning_grpo.rollout.generation import eval_mode
from lightning_grpo.step.batch import LossCounts, UpdateBatch
from lightning_grpo.step.context import StepContext, StepModule
from lightning_grpo.step.finite import gradient_flag, nonfinite_flags, step_is_finite

__all__ = ["MetricSums", "fixed_logprobs", "minibatch_indices", "run_updates"]


def fixed_logprobs(module: StepModule, rollout: Rollout, *, reference: bool) -> Tensor:
    """``(N, T)`` log-probs without gradient (old or, with ``reference``, reference ones): eval mode, by micro-batch.

    Each micro-batch goes through the module's ``compute_logprobs``, so an override of it serves these passes too.
    """
    micro = module.config.micro_batch_size or len(rollout)
    with torch.no_grad(), eval_mode(module.policy):
        parts = [
            module.compute_logprobs(rollout.select(rows), reference=reference).logprobs
            for rows in torch.arange(len(rollout), device=module.device).split(micro)
        ]
    return torch.cat(parts)


def minibatch_indices(num_samples: int, mini_batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """A fresh random permutation of the rows, split into mini-batches of ``mini_batch_size``."""
    yield from torch.randperm(num_samples, generator=generator).split(mini_batch_size)


class MetricSums:
    """Token-weighted running sums of per-micro-batch metrics, averaged at the end."""

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._weights: dict[str, Tensor] = {}

    def add(self, metrics: dict[str, Tensor], weight: Tensor) -> None:
        """Add each metric (a 0-dim tensor) with ``weight`` (e.g. the micro-batch's valid-token count)."""
        for name, value in metrics.items():
            value = value.detach().float()
            weight = torch.as_tensor(weight, dtype=value.dtype, device=value.device)
            self._sums[name] = self._sums.get(name, torch.zeros_like(value)) + value * weight
            self._weights[name] = self._weights.get(name, torch.zeros_like(value)) + weight

    def means(self, sum_across_ranks: SumAcrossRanks | None = None) -> dict[str, Tensor]:
        """The weighted mean of each metric (float32), over all ranks when ``sum_across_ranks`` is given (one reduce).

        The module passes :func:`lightning_grpo.metrics.reduce_across_ranks`, so the means are exact global values.
        """
        if not self._sums:
            return {}
        names = list(self._sums)
        stacked = torch.stack(
            [torch.stack([self._sums[n] for n in names]), torch.stack([self._weights[n] for n in names])]
        )
        if sum_across_ranks is not None:
            stacked = sum_across_ranks(stacked)  # (2, M): weighted sums and weights
        return {name: (stacked[0, i] / stacked[1, i].clamp(min=1e-12)).float() for i, name in enumerate(names)}


def run_updates(module: StepModule, context: StepContext, batch: UpdateBatch) -> tuple[Tensor, dict[str, Tensor]]:
    """``ppo_epochs`` passes over shuffled mini-batches of ``batch``; one optimizer step per mini-batch.

    Args:
        module: The module: its ``compute_loss`` gives each micro-batch's loss; its optimizer and scheduler step.
        context: The step's context (seed, gradient scale, cross-rank sums).
        batch: The rollout with its advantages, loss mask and fixed log-probs.

    Returns:
        The global mean mini-batch loss and the metrics (``pg_loss`` and the token-weighted means of the others),
        exact over all ranks.
    """
    cfg, optimizer = module.config, module.optimizers()
    mini = cfg.mini_batch_size or len(batch)
    micro = cfg.micro_batch_size or mini
    generator = torch.Generator().manual_seed(context.seed)
    norm = float(cfg.loss_agg_norm or cfg.max_new_tokens)
    sums, shares = MetricSums(), []
    epochs = [rows for _ in range(cfg.ppo_epochs) for rows in minibatch_indices(len(batch), mini, generator)]
    for rows in epochs:  # the mini-batches of every pass, each pass a fresh permutation
        minibatch = batch.select(rows.to(context.device))
        counts = LossCounts.of(minibatch.loss_mask, norm, context.sum_across_ranks)
        part, flags = _accumulate(module, context, minibatch, counts, micro, sums)
        shares.append(part)
        flags = torch.cat([flags, gradient_flag(module.policy.parameters(), context.device)])
        if not step_is_finite(context, flags, on_nonfinite=cfg.on_nonfinite, max_skipped=cfg.max_skipped_steps):
            optimizer.zero_grad(set_to_none=True)  # nothing of this iteration's remaining updates is applied
            break
        if cfg.max_grad_norm is not None:
            module.clip_gradients(optimizer, gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    scheduler = module.lr_schedulers()
    if scheduler is not None:
        scheduler.step()
    parts = torch.stack([torch.stack(list(s.values())) for s in shares]).mean(0)  # (loss, pg_loss), this rank
    loss, pg_loss = reduce_across_ranks(parts).float()  # the ranks' parts add up to the global values
    return loss, {"pg_loss": pg_loss, **sums.means(reduce_across_ranks)}


def _accumulate(
    module: StepModule, context: StepContext, minibatch: UpdateBatch, counts: LossCounts, micro: int, sums: MetricSums
) -> tuple[dict[str, Tensor], Tensor]:
    """Backward over the micro-batches of one mini-batch; gradients sync across ranks on the last one only.

    Returns this rank's parts of the mini-batch ``loss`` and ``pg_loss`` (computed with global normalisers, so
    the parts of all ranks add up to the global values) and the non-finite flags of its terms
    (:func:`~lightning_grpo.step.finite.nonfinite_flags`); the other metrics go to ``sums``, weighted by tokens.
    """
    device, optimizer = context.device, module.optimizers()
    shares = {"loss": torch.zeros((), device=device), "pg_loss": torch.zeros((), device=device)}
    chunks = torch.arange(len(minibatch), device=device).split(micro)
    scale = context.grad_scale  # each rank's loss is its share of the global loss; ranks average gradients
    flags = torch.zeros(4, device=device)
    for i, rows in enumerate(chunks):
        part = minibatch.select(rows)
        last = i == len(chunks) - 1
        with optimizer.toggle_model(sync_grad=last), distributed.gradient_sync(module.policy, last):
            loss, metrics = module.compute_loss(part, counts)
            module.manual_backward(loss * scale)
        flags = torch.maximum(flags, nonfinite_flags(loss, metrics))
        shares["loss"] += loss.detach()
        shares["pg_loss"] += metrics.pop("pg_loss").detach()
        sums.add(metrics, part.loss_mask.sum())
    return shares, flags
