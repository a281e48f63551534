"""The GRPO objective of one micro-batch: ``policy loss + β·KL − c_ent·entropy``, one line per term.

:meth:`GRPOModule.compute_loss <lightning_grpo.module.GRPOModule.compute_loss>` computes the log-probs and calls
:func:`grpo_loss`; the terms are the catalogue's functions
(:func:`~lightning_grpo.algorithms.policy_losses.policy_loss`, :func:`~lightning_grpo.algorithms.kl.kl_penalty`),
weighted by truncated importance sampling
(:func:`~lightning_grpo.algorithms.importance.importance_weighted`) when asked. The formulas are on docs/math.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor

from lightning_grpo.algorithms.entropy import top_entropy_mask
from lightning_grpo.algorithms.importance import importance_weighted, rollout_agreement
from lightning_grpo.algorithms.kl import importance_weighted_kl, kl_penalty
from lightning_grpo.algorithms.off_policy import off_policy_masked
from lightning_grpo.algorithms.policy_losses import policy_loss
from lightning_grpo.algorithms.rollout_correction import rollout_correct
from lightning_grpo.algorithms.statistics import masked_mean

__all__ = ["LossSettings", "grpo_loss"]


class LossSettings(Protocol):
    """The settings :func:`grpo_loss` reads; :class:`~lightning_grpo.config.GRPOConfig` has them all."""

    loss_kind: str
    loss_kind_args: dict[str, Any] | None
    clip_low: float
    clip_high: float
    dual_clip: float | None
    delta: float | None
    tis_cap: float | None
    kl_coef: float
    kl_estimator: str
    kl_estimator_args: dict[str, Any] | None
    entropy_coef: float
    top_entropy_quantile: float
    rollout_correction: str | None
    rollout_correction_min: float | None
    rollout_correction_max: float | None
    rollout_rejection: str | None
    rollout_rejection_min: float
    rollout_rejection_max: float
    off_policy_mask_threshold: float | None
    importance_weighted_kl: bool


def grpo_loss(
    logprobs: Tensor,
    entropy: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: LossSettings,
    aggregate: Callable[[Tensor], Tensor],
    *,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    at_sampling_weights: bool = False,
    seed: int | None = None,
    entropy_coef: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one micro-batch and its metrics (``pg_loss``, the clip fractions, ``entropy``, ``kl``, ...).

    Args:
        logprobs: ``(n, T)`` current log-probs, with gradient.
        entropy: ``(n, T)`` current per-token entropy (with gradient when ``entropy_coef > 0``).
        advantages: ``(n,)`` or ``(n, T)`` advantages.
        loss_mask: ``(n, T)`` tokens that enter the loss, the KL, the entropy and every count.
        settings: The loss settings (a :class:`~lightning_grpo.config.GRPOConfig`).
        aggregate: Turns ``(n, T)`` per-token values into this micro-batch's share of the mini-batch loss (global
            normalisers: :meth:`LossCounts.aggregate <lightning_grpo.iteration.types.LossCounts.aggregate>`).
        old_logprobs: ``(n, T)`` log-probs before the update; ``None``: the detached current ones (one update).
        ref_logprobs: ``(n, T)`` reference log-probs; ``None``: no KL term.
        behaviour_logprobs: ``(n, T)`` log-probs the sampler recorded (``Rollout.logprobs``), for TIS and agreement.
        at_sampling_weights: Whether ``logprobs`` are of the weights that sampled (the step's first mini-batch): only
            then are ``rollout_logprob_diff_*`` logged.
        seed: Seed of the policy loss's random choices (``clip_cov``): the step's seed; ``None``: torch's global one.
        entropy_coef: The entropy bonus's coefficient of this step (the module's entropy control); ``None``:
            ``settings.entropy_coef``.
    """
    old = old_logprobs if old_logprobs is not None else logprobs.detach()
    per_token, stats = policy_loss(
        logprobs, old, advantages, loss_mask, kind=settings.loss_kind, kind_args=settings.loss_kind_args,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high, dual_clip=settings.dual_clip, delta=settings.delta, seed=seed,
    )  # fmt: skip
    per_token, tis = importance_weighted(per_token, old, behaviour_logprobs, loss_mask, settings.tis_cap)
    per_token, corrected = _off_policy_terms(
        per_token, logprobs, old, advantages, loss_mask, settings, behaviour_logprobs
    )
    selected = _selected(entropy, loss_mask, settings.top_entropy_quantile)
    if selected is not None:
        per_token = per_token * selected
    pg_loss = aggregate(per_token)
    metrics = {"pg_loss": pg_loss, **stats.as_metrics(), **tis, **corrected}
    metrics["entropy"] = masked_mean(entropy.detach(), loss_mask)
    if at_sampling_weights:
        metrics.update(rollout_agreement(logprobs, behaviour_logprobs, loss_mask))
    loss = pg_loss
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, settings.kl_estimator, settings.kl_estimator_args)  # (n, T)
        if settings.importance_weighted_kl:
            kl = importance_weighted_kl(kl, logprobs, old)
        loss = loss + settings.kl_coef * aggregate(kl)
        metrics["kl"] = masked_mean(kl.detach(), loss_mask)
    coef = settings.entropy_coef if entropy_coef is None else entropy_coef
    if coef > 0:
        loss = loss - coef * aggregate(entropy if selected is None else entropy * selected)
    if entropy_coef is not None or coef > 0:
        metrics["entropy_coef"] = loss.new_tensor(float(coef)).detach()
    if selected is not None:
        metrics["entropy_selected_frac"] = masked_mean(selected, loss_mask)
    return loss, metrics


def _off_policy_terms(
    per_token: Tensor,
    logprobs: Tensor,
    old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: LossSettings,
    behaviour_logprobs: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Rollout correction and rejection, then OPSM (``rollout_correction.py``, ``off_policy.py``)."""
    correction = (settings.rollout_correction, settings.rollout_correction_min, settings.rollout_correction_max)
    rejection = (settings.rollout_rejection, settings.rollout_rejection_min, settings.rollout_rejection_max)
    per_token, metrics = rollout_correct(per_token, old, behaviour_logprobs, loss_mask, correction, rejection)
    sampler = behaviour_logprobs if behaviour_logprobs is not None else old  # TRL's rule
    per_token, opsm = off_policy_masked(
        per_token, advantages, logprobs, sampler, loss_mask, settings.off_policy_mask_threshold
    )
    return per_token, {**metrics, **opsm}


def _selected(entropy: Tensor, loss_mask: Tensor, quantile: float) -> Tensor | None:
    """The ``(n, T)`` float mask of top-entropy selection (per micro-batch), ``None`` when it keeps all."""
    if quantile >= 1.0:
        return None
    return top_entropy_mask(entropy, loss_mask, quantile).to(entropy.dtype)
