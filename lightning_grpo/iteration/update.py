"""The update loop, in one file: from the module's ``update_policy`` to ``optimizer.step()``.

:meth:`GRPOModule.update_policy <lightning_grpo.module.GRPOModule.update_policy>` calls :func:`run_updates` with the
module's steps as explicit arguments: its (possibly overridden) ``compute_loss`` gives each micro-batch's loss
(:func:`~lightning_grpo.algorithms.objective.grpo_loss` by default), ``manual_backward`` runs the backward, and the
optimizer, gradient clipping and scheduler are Lightning's. :meth:`~lightning_grpo.module.GRPOModule.prepare_update`
calls :func:`sampling_logprobs` and :func:`fixed_logprobs` with the module's ``compute_logprobs`` the same way, so an
override of it serves the old and reference passes too. Nothing here calls back into the module (docs/index.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from lightning_grpo import distributed
from lightning_grpo.algorithms.importance import lifted_behaviour
from lightning_grpo.algorithms.peer_normalisers import kept_rejection, peer_normalisers
from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.iteration.micro_batches import micro_batch_rows
from lightning_grpo.iteration.nonfinite import gradient_flag, nonfinite_flags, step_is_finite_with_tokens
from lightning_grpo.iteration.rank_rows import agreed_minibatches, idle_minibatch, idle_rollout, ranks_differ
from lightning_grpo.iteration.timing import PhaseTimer
from lightning_grpo.iteration.types import LossCounts, UpdateBatch
from lightning_grpo.metrics import MetricSums as _MetricSums
from lightning_grpo.metrics import reduce_across_ranks, without_extrema
from lightning_grpo.rollout import Rollout, TokenLogProbs
from lightning_grpo.rollout.agent_client import is_agent_rollout
from lightning_grpo.rollout.generation import eval_mode

__all__ = [
    "LogProbsStep",
    "LossStep",
    "fixed_logprobs",
    "minibatch_indices",
    "run_updates",
    "sampling_logprobs",
    "update_batch",
]

#: The module's ``compute_logprobs(rollout, *, reference=False, with_entropy=False)``.
LogProbsStep = Callable[..., TokenLogProbs]
#: The module's ``compute_loss(batch, counts) -> (loss, metrics)`` of one micro-batch.
LossStep = Callable[[UpdateBatch, LossCounts], tuple[Tensor, dict[str, Tensor]]]


def fixed_logprobs(
    compute_logprobs: LogProbsStep,
    policy: nn.Module,
    rollout: Rollout,
    micro_batch_size: int | None,
    *,
    reference: bool,
    micro_batch_tokens: int | None = None,
    sum_across_ranks: Callable[[Tensor], Tensor] | None = None,
) -> TokenLogProbs:
    """``(N, T)`` log-probs without gradient (old or, with ``reference``, reference ones): eval mode, by micro-batch.

    The old pass keeps the log kept mass too (``TokenLogProbs.kept_log_mass``, for the comparisons with the sampler;
    ``None`` when nothing was truncated or ``compute_logprobs`` gives none).

    Args:
        compute_logprobs: The module's ``compute_logprobs`` (an override of it serves these passes too).
        policy: The policy, put in eval mode for the pass.
        rollout: The rollout.
        micro_batch_size: Rows per forward; ``None``: all at once.
        reference: Log-probs of the reference policy (the adapter disabled) rather than of the current one.
        micro_batch_tokens: Token budget per forward (:mod:`~lightning_grpo.iteration.micro_batches`); ``None``: by
            ``micro_batch_size`` alone.
        sum_across_ranks: Sums over ranks, for the ranks to agree on the number of forwards (FSDP2 gathers in each);
            ``None``: one process.
    """
    sums = sum_across_ranks or (lambda tensor: tensor)
    device = rollout.completion_ids.device
    chunks = micro_batch_rows(rollout, micro_batch_size, micro_batch_tokens, sums, device)  # host indices: no sync
    order, parts = torch.cat([torch.zeros(0, dtype=torch.long, device="cpu"), *chunks]), []
    with torch.no_grad(), eval_mode(policy):
        for rows in chunks:  # an empty micro-batch (a rank with fewer tokens) runs one row, for the collectives
            part = rollout.select(rows) if len(rows) else idle_rollout(rollout)
            found = compute_logprobs(part, reference=reference)
            parts += [found] if len(rows) else []
    if not parts:  # a rank without rows (its agents made no chat call)
        zeros = torch.zeros(rollout.completion_ids.shape, device=device)
        return TokenLogProbs(zeros, kept_log_mass=None if rollout.kept_margins is None else zeros)
    inverse = torch.argsort(order).to(device)
    masses = [part.kept_log_mass for part in parts]
    mass = None if any(m is None for m in masses) else torch.cat(masses)[inverse]  # type: ignore[arg-type]
    return TokenLogProbs(torch.cat([part.logprobs for part in parts])[inverse], kept_log_mass=mass)


def sampling_logprobs(
    compute_logprobs: LogProbsStep,
    policy: nn.Module,
    rollout: Rollout,
    config: GRPOConfig,
    timer: PhaseTimer,
    device: torch.device,
    sum_across_ranks: Callable[[Tensor], Tensor] | None = None,
) -> TokenLogProbs | None:
    """``(N, T)`` old log-probs of the rollout (with their log kept mass when recomputed); ``None`` (the detached
    current ones) when it serves one update.

    ``config.corrections.old_logprobs`` chooses: ``"recompute"`` runs :func:`fixed_logprobs` (timed as ``old_logprobs``)
    for a rollout that serves several updates, or one when the rollout rejection counts the mini-batch's kept
    sequences (``normalise: kept`` needs every row's old log-probs before the first micro-batch); ``"rollout"`` takes
    the behaviour log-probs the sampler recorded (``rollout.logprobs``), moved to ``device``, whatever the number of
    updates (verl's bypass mode: the ratio is ``π/μ`` from the first update on, so the clip, DPPO's trust region and
    OPSM see the sampler mismatch).
    ``compute_logprobs``, ``policy`` and ``sum_across_ranks`` are as for :func:`fixed_logprobs`.

    Raises:
        ValueError: ``old_logprobs="rollout"`` and the rollout holds no log-probs (a ``generate`` override that does
            not fill ``Rollout.logprobs``).
    """
    if config.corrections.old_logprobs == "rollout":
        if rollout.logprobs is None:
            raise ValueError(
                "old_logprobs='rollout' needs the sampled log-probs (Rollout.logprobs), but this rollout has none: "
                "fill Rollout.logprobs in your generate override, or use old_logprobs='recompute'"
            )
        return TokenLogProbs(rollout.logprobs.to(device))  # on the sampler's kept set: batch_loss lifts it
    if ranks_differ(is_agent_rollout(rollout)):  # the ranks decide alike (fixed_logprobs may hold collectives)
        sums = sum_across_ranks or (lambda tensor: tensor)
        minibatches = agreed_minibatches(config.update.minibatches(len(rollout)), sums, device)
        if config.update.ppo_epochs * minibatches <= 1 and kept_rejection(config.corrections) is None:
            return None
    elif config.update.updates(len(rollout)) <= 1 and kept_rejection(config.corrections) is None:
        return None  # one optimizer step: the detached current log-probs are π_old
    with timer("old_logprobs"):
        return fixed_logprobs(
            compute_logprobs,
            policy,
            rollout,
            config.update.micro_batch_size,
            reference=False,
            micro_batch_tokens=config.update.micro_batch_tokens,
            sum_across_ranks=sum_across_ranks,
        )


def update_batch(
    compute_logprobs: LogProbsStep,
    policy: nn.Module,
    rollout: Rollout,
    advantages: Tensor,
    config: GRPOConfig,
    context: IterationContext,
) -> UpdateBatch:
    """What the updates read (phase 4): the loss mask, old log-probs (:func:`sampling_logprobs`) and, with a KL
    coefficient, the reference's (:func:`fixed_logprobs`, timed as ``reference``), with the iteration's ``context``
    (timer, device, cross-rank sums).

    Tool and environment tokens are context, never loss (``rollout.sampled_mask``); ``mask_truncated_completions``
    drops truncated completions from the loss too.
    """
    loss_mask = rollout.sampled_mask
    if config.objective.mask_truncated_completions:
        loss_mask = loss_mask * (~rollout.truncated)[:, None]
    timer, sum_across_ranks = context.timer, context.sum_across_ranks
    old = sampling_logprobs(compute_logprobs, policy, rollout, config, timer, context.device, sum_across_ranks)
    ref = None
    if config.objective.kl_coef > 0:
        with timer("reference"):
            ref = fixed_logprobs(
                compute_logprobs,
                policy,
                rollout,
                config.update.micro_batch_size,
                reference=True,
                micro_batch_tokens=config.update.micro_batch_tokens,
                sum_across_ranks=sum_across_ranks,
            ).logprobs
    if old is None:
        return UpdateBatch(rollout, advantages, loss_mask, None, ref)
    return UpdateBatch(rollout, advantages, loss_mask, old.logprobs, ref, old_kept_log_mass=old.kept_log_mass)


def minibatch_indices(num_samples: int, mini_batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """A fresh random permutation of the rows, split into mini-batches of ``mini_batch_size``."""
    yield from torch.randperm(num_samples, generator=generator, device=generator.device).split(mini_batch_size)


def run_updates(
    batch: UpdateBatch,
    context: IterationContext,
    config: GRPOConfig,
    *,
    policy: nn.Module,
    compute_loss: LossStep,
    backward: Callable[[Tensor], None],
    optimizer: Any,
    clip_gradients: Callable[..., None],
    scheduler: Any = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``ppo_epochs`` passes over shuffled mini-batches of ``batch``; one optimizer step per mini-batch.

    Args:
        batch: The rollout with its advantages, loss mask and fixed log-probs.
        context: The step's context (seed, gradient scale, cross-rank sums), built once by ``training_step``.
        config: The algorithm settings (batch sizes, ``ppo_epochs``, clipping, non-finite handling).
        policy: The policy whose gradients are synchronised, checked and clipped.
        compute_loss: The module's ``compute_loss``: each micro-batch's loss and metrics.
        backward: The module's ``manual_backward``.
        optimizer: The module's (Lightning-wrapped) optimizer.
        clip_gradients: The module's ``clip_gradients(optimizer, gradient_clip_val=, gradient_clip_algorithm=)``.
        scheduler: The learning-rate scheduler, stepped once at the end; ``None``: none.

    Returns:
        The global mean mini-batch loss and the metrics (``pg_loss`` and the token-weighted means of the others),
        exact over all ranks. A step without a loss token on any rank has no ``*_max`` / ``*_min`` metrics (they
        would hold an infinity or a meaningless 0); every rank decides alike, from the guard's host copy.
    """
    mini = config.update.mini_batch_size or max(len(batch), 1)  # a rank without rows runs idle mini-batches
    micro = config.update.micro_batch_size or mini
    generator = torch.Generator().manual_seed(context.seed)
    norm = float(config.objective.loss_agg_norm or config.sampling.max_new_tokens)
    faults = config.faults
    sums, shares, tokens = _MetricSums(), [], 0.0
    passes = range(config.update.ppo_epochs)
    epochs = [rows for _ in passes for rows in _pass_rows(batch, mini, generator, config, context)]
    for index, rows in enumerate(epochs):  # the mini-batches of every pass, each pass a fresh permutation
        selected = batch.select(rows) if len(rows) else idle_minibatch(batch)  # an idle one: rows vary by rank
        minibatch = replace(selected, at_sampling_weights=index == 0)  # rows on the host: no sync
        peer = peer_normalisers(
            minibatch.loss_mask,
            config.objective,
            config.corrections,
            old_logprobs=minibatch.old_logprobs,
            behaviour_logprobs=lifted_behaviour(minibatch.rollout.logprobs, minibatch.old_kept_log_mass),
            sum_across_ranks=context.sum_across_ranks,
        )
        counts = LossCounts.of(minibatch.loss_mask, norm, context.sum_across_ranks, peer)
        sizes = (micro, config.update.micro_batch_tokens)
        part, flags = _accumulate(minibatch, counts, sizes, sums, context, policy, compute_loss, backward, optimizer)
        shares.append(part)
        flags = torch.cat([flags, gradient_flag(policy.parameters(), context.device)])
        guard = {"on_nonfinite": faults.on_nonfinite, "max_skipped": faults.max_skipped_steps}
        finite, counted = step_is_finite_with_tokens(context, flags, counts.num_tokens, **guard)  # one host sync
        tokens += counted  # global: the same on every rank
        if not finite:
            optimizer.zero_grad(set_to_none=True)  # nothing of this iteration's remaining updates is applied
            break
        if config.update.max_grad_norm is not None:
            clip_gradients(optimizer, gradient_clip_val=config.update.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    parts = torch.stack([torch.stack(list(s.values())) for s in shares]).mean(0)  # (loss, pg_loss), this rank
    loss, pg_loss = reduce_across_ranks(parts).float()  # the ranks' parts add up to the global values
    metrics = sums.means(reduce_across_ranks)  # a collective: every rank calls it, with or without loss tokens
    return loss, {"pg_loss": pg_loss, **(metrics if tokens else without_extrema(metrics))}


def _pass_rows(
    batch: UpdateBatch, mini: int, generator: torch.Generator, config: GRPOConfig, context: IterationContext
) -> list[Tensor]:
    """The mini-batches of one pass; with rows that vary by rank, as many as the rank with the most (some empty)."""
    parts = list(minibatch_indices(len(batch), mini, generator))
    if not ranks_differ(is_agent_rollout(batch.rollout)):
        return parts
    agreed = agreed_minibatches(config.update.minibatches(len(batch)), context.sum_across_ranks, context.device)
    return parts + [torch.zeros(0, dtype=torch.long, device=generator.device)] * (agreed - len(parts))


def _accumulate(
    minibatch: UpdateBatch,
    counts: LossCounts,
    sizes: tuple[int, int | None],
    sums: _MetricSums,
    context: IterationContext,
    policy: nn.Module,
    compute_loss: LossStep,
    backward: Callable[[Tensor], None],
    optimizer: Any,
) -> tuple[dict[str, Tensor], Tensor]:
    """Backward over the micro-batches of one mini-batch; gradients sync across ranks on the last one only.

    ``sizes`` is ``(rows, tokens)``: at most ``rows`` rows per micro-batch and, if ``tokens`` is set, at most
    ``tokens`` tokens (:func:`~lightning_grpo.iteration.micro_batches.micro_batch_rows`: the same number of
    micro-batches on every rank, some possibly empty).

    Returns this rank's parts of the mini-batch ``loss`` and ``pg_loss`` (computed with global normalisers, so
    the parts of all ranks add up to the global values) and the non-finite flags of its terms
    (:func:`~lightning_grpo.iteration.nonfinite.nonfinite_flags`); the other metrics go to ``sums``, weighted by tokens.
    """
    device = context.device
    shares = {"loss": torch.zeros((), device=device), "pg_loss": torch.zeros((), device=device)}
    chunks = micro_batch_rows(minibatch.rollout, *sizes, context.sum_across_ranks, device)  # host indices
    chunks = [rows for rows in chunks if not len(rows)] + [rows for rows in chunks if len(rows)]  # empty ones first
    scale = context.grad_scale  # each rank's loss is its share of the global loss; ranks average gradients
    flags = torch.zeros(4, device=device)
    for i, rows in enumerate(chunks):
        part = minibatch.select(rows if len(rows) else torch.arange(1))
        last = i == len(chunks) - 1
        with optimizer.toggle_model(sync_grad=last), distributed.gradient_sync(policy, last):
            loss, metrics = compute_loss(part, counts)
            backward(loss * (scale if len(rows) else 0.0))  # an empty micro-batch: a zero gradient, for the sync
        if not len(rows):
            continue
        flags = torch.maximum(flags, nonfinite_flags(loss, metrics))
        shares["loss"] += loss.detach()
        shares["pg_loss"] += metrics.pop("pg_loss").detach()
        sums.add(metrics, part.loss_mask.sum())
    return shares, flags
