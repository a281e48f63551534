"""The policy-update pass: ``ppo_epochs`` over shuffled mini-batches, micro-batch backward, metric sums.

:meth:`GRPOModule.update_policy <lightning_grpo.module.GRPOModule.update_policy>` calls :func:`run_updates`; the
loss of each micro-batch still comes from the module's overridable ``compute_loss`` (docs/index.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor

from lightning_grpo import distributed
from lightning_grpo.algorithms.importance import truncated_importance_weights
from lightning_grpo.algorithms.statistics import SumAcrossRanks, masked_mean
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.rollout import Rollout
from lightning_grpo.rollout.generation import eval_mode
from lightning_grpo.step.batch import LossCounts, UpdateBatch
from lightning_grpo.step.context import StepContext, StepModule
from lightning_grpo.step.finite import gradient_flag, nonfinite_flags, step_is_finite
from lightning_grpo.step.timing import PhaseTimer

__all__ = [
    "MetricSums",
    "fixed_logprobs",
    "importance_weighted",
    "minibatch_indices",
    "rollout_agreement",
    "run_updates",
    "sampling_logprobs",
]


def fixed_logprobs(module: StepModule, rollout: Rollout, *, reference: bool) -> Tensor:
    """``(N, T)`` log-probs without gradient (old or, with ``reference``, reference ones): eval mode, by micro-batch.

    Each micro-batch goes through the module's ``compute_logprobs``, so an override of it serves these passes too.
    """
    micro = module.config.micro_batch_size or len(rollout)
    with torch.no_grad(), eval_mode(module.policy):
        parts = [
            module.compute_logprobs(rollout.select(rows), reference=reference).logprobs
            for rows in torch.arange(len(rollout), device="cpu").split(micro)  # host indices: no sync to select
        ]
    return torch.cat(parts)


def sampling_logprobs(module: StepModule, rollout: Rollout, timer: PhaseTimer) -> Tensor | None:
    """``(N, T)`` old log-probs of a rollout that serves several updates; ``None`` when it serves one.

    ``config.old_logprobs`` chooses: ``"recompute"`` runs :func:`fixed_logprobs` (timed as ``old_logprobs``),
    ``"rollout"`` takes the behaviour log-probs the sampler recorded (``rollout.logprobs``).

    Raises:
        ValueError: ``old_logprobs="rollout"`` and the rollout holds no log-probs (a ``generate`` override that does
            not fill ``Rollout.logprobs``).
    """
    cfg = module.config
    if cfg.ppo_epochs * len(rollout) // (cfg.mini_batch_size or len(rollout)) <= 1:
        return None
    if cfg.old_logprobs == "rollout":
        if rollout.logprobs is None:
            raise ValueError(
                "old_logprobs='rollout' needs the sampled log-probs (Rollout.logprobs), but this rollout has none: "
                "fill Rollout.logprobs in your generate override, or use old_logprobs='recompute'"
            )
        return rollout.logprobs.to(module.device)
    with timer("old_logprobs"):
        return fixed_logprobs(module, rollout, reference=False)


def rollout_agreement(batch: UpdateBatch, logprobs: Tensor) -> dict[str, Tensor]:
    """``rollout_logprob_diff_mean``/``_max``: ``|logprobs - rollout.logprobs|`` over the loss tokens of ``batch``.

    Only for the micro-batches of the first mini-batch of a step (``batch.at_sampling_weights``), whose training
    log-probs are those of the weights that sampled; empty otherwise, or for a rollout without log-probs.
    """
    behaviour = batch.rollout.logprobs
    if not batch.at_sampling_weights or behaviour is None:
        return {}
    diff, mask = (logprobs.detach() - behaviour.to(logprobs.device)).abs(), batch.loss_mask.bool()  # (n, T)
    worst = torch.where(mask, diff, torch.zeros_like(diff)).amax() if diff.numel() else diff.new_zeros(())
    return {"rollout_logprob_diff_mean": masked_mean(diff, mask), "rollout_logprob_diff_max": worst}


def importance_weighted(
    per_token: Tensor, batch: UpdateBatch, old_logprobs: Tensor, cap: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss weighted by truncated importance sampling (``GRPOConfig.tis_cap``), and its metrics.

    Returns ``per_token`` unchanged and no metrics when ``cap`` is ``None``. Metrics: ``tis_weight_mean`` and
    ``tis_capped_frac`` (the share of loss tokens whose weight hit the cap).

    Raises:
        ValueError: The rollout holds no behaviour log-probs (a ``generate`` override that does not fill them).
    """
    if cap is None:
        return per_token, {}
    behaviour = batch.rollout.logprobs
    if behaviour is None:
        raise ValueError("tis_cap needs the sampled log-probs (Rollout.logprobs), but this rollout has none: fill "
                         "Rollout.logprobs in your generate override, or set tis_cap: null")  # fmt: skip
    weights = truncated_importance_weights(old_logprobs.detach(), behaviour.to(per_token.device), cap)  # (n, T)
    mask = batch.loss_mask.bool()
    capped = (weights >= cap * (1 - 1e-6)).float()
    metrics = {"tis_weight_mean": masked_mean(weights, mask), "tis_capped_frac": masked_mean(capped, mask)}
    return per_token * weights, metrics


def minibatch_indices(num_samples: int, mini_batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """A fresh random permutation of the rows, split into mini-batches of ``mini_batch_size``."""
    yield from torch.randperm(num_samples, generator=generator, device=generator.device).split(mini_batch_size)


class MetricSums:
    """Token-weighted running sums of per-micro-batch metrics, averaged at the end; ``*_max`` metrics are maxima."""

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._weights: dict[str, Tensor] = {}
        self._maxima: dict[str, Tensor] = {}

    def add(self, metrics: dict[str, Tensor], weight: Tensor) -> None:
        """Add each metric (a 0-dim tensor) with ``weight`` (e.g. the micro-batch's valid-token count)."""
        for name, value in metrics.items():
            value = value.detach().float()
            if name.endswith("_max"):
                self._maxima[name] = torch.maximum(self._maxima.get(name, value), value)
                continue
            weight = torch.as_tensor(weight, dtype=value.dtype, device=value.device)
            self._sums[name] = self._sums.get(name, torch.zeros_like(value)) + value * weight
            self._weights[name] = self._weights.get(name, torch.zeros_like(value)) + weight

    def means(self, sum_across_ranks: SumAcrossRanks | None = None) -> dict[str, Tensor]:
        """The weighted mean of each metric (float32), over all ranks when ``sum_across_ranks`` is given (one reduce).

        The module passes :func:`lightning_grpo.metrics.reduce_across_ranks`, so the means are exact global values.
        """
        maxima = self._reduced_maxima(sum_across_ranks is not None)
        if not self._sums:
            return maxima
        names = list(self._sums)
        stacked = torch.stack(
            [torch.stack([self._sums[n] for n in names]), torch.stack([self._weights[n] for n in names])]
        )
        if sum_across_ranks is not None:
            stacked = sum_across_ranks(stacked)  # (2, M): weighted sums and weights
        means = {name: (stacked[0, i] / stacked[1, i].clamp(min=1e-12)).float() for i, name in enumerate(names)}
        return {**means, **maxima}

    def _reduced_maxima(self, across_ranks: bool) -> dict[str, Tensor]:
        """The ``*_max`` metrics, over all ranks when asked (every rank has the same names: one reduce)."""
        if not self._maxima:
            return {}
        names = sorted(self._maxima)
        stacked = torch.stack([self._maxima[n] for n in names])
        if across_ranks:
            stacked = reduce_across_ranks(stacked, "max").reshape(-1)  # torchmetrics squeezes one value
        return {name: stacked[i].float() for i, name in enumerate(names)}


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
    for index, rows in enumerate(epochs):  # the mini-batches of every pass, each pass a fresh permutation
        minibatch = replace(batch.select(rows), at_sampling_weights=index == 0)  # rows on the host: no sync
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
    chunks = torch.arange(len(minibatch), device="cpu").split(micro)  # host indices: selecting needs no sync
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
