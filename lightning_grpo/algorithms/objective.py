"""The GRPO objective of one micro-batch: ``policy loss + β·KL − c_ent·entropy``, one line per term.

:meth:`GRPOModule.compute_loss <lightning_grpo.module.GRPOModule.compute_loss>` computes the log-probs and calls
:func:`grpo_loss`; the terms are the catalogue's functions
(:func:`~lightning_grpo.algorithms.policy_losses.policy_loss`, :func:`~lightning_grpo.algorithms.kl.kl_penalty`),
with the off-policy corrections chosen in the settings (:mod:`~lightning_grpo.algorithms.corrections`: rollout
correction, rejection, OPSM, KL weighting, token selection). The formulas are on docs/math.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor

from lightning_grpo.algorithms.corrections import build_correction
from lightning_grpo.algorithms.importance import lifted_behaviour, rollout_agreement
from lightning_grpo.algorithms.kl import kl_penalty
from lightning_grpo.algorithms.peer_normalisers import PeerNormalisers, peer_normalisers, selected_entropy_scale
from lightning_grpo.algorithms.policy_losses import policy_loss
from lightning_grpo.algorithms.statistics import masked_mean

__all__ = ["CorrectionSettings", "LossSettings", "grpo_loss"]


class LossSettings(Protocol):
    """The loss settings :func:`grpo_loss` reads (``GRPOConfig.objective`` has them all)."""

    loss_kind: str
    loss_kind_args: dict[str, Any] | None
    loss_agg_mode: str
    clip_low: float
    clip_high: float
    dual_clip: float | None
    delta: float | None
    kl_coef: float
    kl_estimator: str
    kl_estimator_args: dict[str, Any] | None
    entropy_coef: float
    kl_weighting: str | None
    kl_weighting_args: dict[str, Any] | None
    token_selection: str | None
    token_selection_args: dict[str, Any] | None


class CorrectionSettings(Protocol):
    """The off-policy corrections :func:`grpo_loss` applies (``GRPOConfig.corrections`` has them all)."""

    rollout_correction: str | None
    rollout_correction_args: dict[str, Any] | None
    rollout_rejection: str | None
    rollout_rejection_args: dict[str, Any] | None
    off_policy_mask: str | None
    off_policy_mask_args: dict[str, Any] | None


def grpo_loss(
    logprobs: Tensor,
    entropy: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: LossSettings,
    aggregate: Callable[[Tensor], Tensor],
    *,
    corrections: CorrectionSettings | None = None,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    at_sampling_weights: bool = False,
    seed: int | None = None,
    entropy_coef: float | None = None,
    normalisers: PeerNormalisers | None = None,
    kept_log_mass: Tensor | None = None,
    old_kept_log_mass: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one micro-batch and its metrics (``pg_loss``, the clip fractions, ``entropy``, ``kl``, ...).

    Args:
        logprobs: ``(n, T)`` current log-probs, with gradient.
        entropy: ``(n, T)`` current per-token entropy (with gradient when ``entropy_coef > 0``).
        advantages: ``(n,)`` or ``(n, T)`` advantages.
        loss_mask: ``(n, T)`` tokens that enter the loss, the KL, the entropy and every count.
        settings: The loss settings (``GRPOConfig.objective``).
        aggregate: Turns ``(n, T)`` per-token values into this micro-batch's share of the mini-batch loss (global
            normalisers: :meth:`LossCounts.aggregate <lightning_grpo.iteration.types.LossCounts.aggregate>`).
        corrections: The off-policy corrections (``GRPOConfig.corrections``); ``None``: none.
        old_logprobs: ``(n, T)`` log-probs before the update; ``None``: the detached current ones (one update).
        ref_logprobs: ``(n, T)`` reference log-probs; ``None``: no KL term.
        behaviour_logprobs: ``(n, T)`` log-probs the sampler recorded (``Rollout.logprobs``), for the rollout
            correction and rejection, OPSM and the agreement metrics.
        at_sampling_weights: Whether ``logprobs`` are of the weights that sampled (the step's first mini-batch): only
            then are ``rollout_logprob_diff_*`` logged.
        seed: Seed of the policy loss's random choices (``clip_cov``): the step's seed; ``None``: torch's global one.
        entropy_coef: The entropy bonus's coefficient of this step (the module's entropy control); ``None``:
            ``settings.entropy_coef``.
        normalisers: The mini-batch's peer normalisers over every rank
            (:func:`~lightning_grpo.algorithms.peer_normalisers.peer_normalisers`); ``None``: counted on this
            micro-batch when a peer setting is on (exact for one micro-batch on one rank).
        kept_log_mass: ``(n, T)`` the current policy's log mass on the sampler's kept sets (detached;
            ``TokenLogProbs.kept_log_mass``); ``None``: nothing was truncated. Every comparison with
            ``behaviour_logprobs`` is then on the kept set
            (:func:`~lightning_grpo.algorithms.importance.lifted_behaviour`).
        old_kept_log_mass: The same for ``old_logprobs`` (``None`` with ``old_logprobs=None``: the current one).
    """
    old = old_logprobs if old_logprobs is not None else logprobs.detach()
    old_mass = old_kept_log_mass if old_logprobs is not None else kept_log_mass
    sampler_vs_old = lifted_behaviour(behaviour_logprobs, old_mass)
    sampler_vs_current = lifted_behaviour(behaviour_logprobs, kept_log_mass)
    per_token, stats = policy_loss(
        logprobs,
        old,
        advantages,
        loss_mask,
        kind=settings.loss_kind,
        kind_args=settings.loss_kind_args,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        dual_clip=settings.dual_clip,
        delta=settings.delta,
        seed=seed,
    )
    samplers = (sampler_vs_old, sampler_vs_current)
    per_token, corrected = _off_policy_terms(per_token, logprobs, old, advantages, loss_mask, corrections, samplers)
    select = _component(settings, "token_selection")
    selected = None if select is None else select(entropy, loss_mask)
    if selected is not None:
        per_token = per_token * selected
    pg_loss = aggregate(per_token)
    if normalisers is None:
        sampler = sampler_vs_old
        normalisers = peer_normalisers(loss_mask, settings, corrections, old_logprobs=old, behaviour_logprobs=sampler)
    if normalisers is not None:  # verl's gmpo rows or rejection normaliser
        pg_loss = pg_loss * normalisers.policy_scale.to(pg_loss.dtype)
    metrics = {"pg_loss": pg_loss, **stats.as_metrics(), **corrected}
    metrics["entropy"] = masked_mean(entropy.detach(), loss_mask)
    if at_sampling_weights:
        metrics.update(rollout_agreement(logprobs, sampler_vs_current, loss_mask))
    loss = pg_loss
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, settings.kl_estimator, settings.kl_estimator_args)  # (n, T)
        weighting = _component(settings, "kl_weighting")
        if weighting is not None:
            kl = weighting(kl, logprobs, old, loss_mask)
        loss = loss + settings.kl_coef * aggregate(kl)
        metrics["kl"] = masked_mean(kl.detach(), loss_mask)
    coef = settings.entropy_coef if entropy_coef is None else entropy_coef
    if coef > 0:
        if selected is None:
            loss = loss - coef * aggregate(entropy)
        else:  # the selected tokens' entropy, over all loss tokens or (TRL) over the selected ones
            loss = loss - coef * aggregate(entropy * selected) * selected_entropy_scale(select, selected, loss_mask)
    if entropy_coef is not None or coef > 0:
        metrics["entropy_coef"] = loss.new_tensor(float(coef)).detach()
    if selected is not None:
        metrics["entropy_selected_frac"] = masked_mean(selected, loss_mask)
    return loss, metrics


def _component(settings: LossSettings | CorrectionSettings | None, setting: str) -> Any:
    """The correction ``setting`` names, built with ``<setting>_args`` (cached); ``None`` when it is off."""
    if settings is None:
        return None
    return build_correction(setting, getattr(settings, setting), getattr(settings, f"{setting}_args"))


def _off_policy_terms(
    per_token: Tensor,
    logprobs: Tensor,
    old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: CorrectionSettings | None,
    samplers: tuple[Tensor | None, Tensor | None],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Rollout correction, rejection (``rollout_correction.py``), then OPSM (``off_policy.py``).

    ``samplers``: the sampler's log-probs lifted for comparison with ``old`` and with ``logprobs``.
    """
    metrics: dict[str, Tensor] = {}
    vs_old, vs_current = samplers
    for setting in ("rollout_correction", "rollout_rejection"):
        component = _component(settings, setting)
        if component is not None:
            per_token, found = component(per_token, old.detach(), vs_old, loss_mask)
            metrics.update(found)
    mask = _component(settings, "off_policy_mask")
    if mask is not None:
        sampler = vs_current if vs_current is not None else old  # TRL's rule
        per_token, found = mask(per_token, advantages, logprobs, sampler, loss_mask)
        metrics.update(found)
    return per_token, metrics
