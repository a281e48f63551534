"""Per-token policy-gradient losses (to be aggregated with ``aggregate_loss``).

Kinds (choose by name, see :data:`POLICY_LOSSES`):

* ``clip`` — PPO's clipped surrogate (Schulman et al., 2017, arXiv:1707.06347) as used by GRPO, with asymmetric
  "clip-higher" bounds (DAPO, arXiv:2503.14476), dual clip for negative advantages (Ye et al., 2020,
  arXiv:1912.09729) and an optional upper bound ``delta`` on the ratio (INTELLECT-2, arXiv:2505.07291).
* ``gspo`` — Group Sequence Policy Optimization (Zheng et al., 2025, arXiv:2507.18071): the sequence-level ratio
  ``exp(mean_t(logp - old_logp))`` with a straight-through token gradient.
* ``cispo`` — CISPO (MiniMax-M1, arXiv:2506.13585): the clipped importance weight, detached, times the log-prob.
* ``sapo``, ``gmpo``, ``gpg`` — soft gate, geometric mean, plain policy gradient
  (:mod:`~lightning_grpo.algorithms.soft_losses`); ``dppo_tv``, ``dppo_kl`` — DPPO's binary trust region
  (:mod:`~lightning_grpo.algorithms.divergence_losses`); ``clip_cov``, ``kl_cov`` — covariance-selected tokens
  (:mod:`~lightning_grpo.algorithms.covariance_losses`). Each has settings of its own, with the papers' defaults.

A loss of your own is a :data:`PolicyLossFunction` named by its import path (``loss_kind:
my_project.losses.my_loss``): it receives the tensors and one :class:`PolicyLossSettings` and returns
:class:`PolicyLossTerms` (docs/index.md, "Add your own loss"). Its own settings are its keyword-only parameters (or
its class's ``__init__`` arguments), given by ``loss_kind_args``; the built-ins' settings are the clip settings they
use (``loss_kind_args: {clip_high: 0.28}``), which default to ``GRPOConfig``'s fields of the same names
(:mod:`~lightning_grpo.algorithms.components`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms import covariance_losses, divergence_losses, soft_losses
from lightning_grpo.algorithms._checks import check_same_shape
from lightning_grpo.algorithms.components import ComponentRole, build_component
from lightning_grpo.algorithms.policy_loss_terms import (
    MAX_SEQ_LOG_RATIO,
    PolicyLossSettings,
    PolicyLossTerms,
    check_clip_args,
    log_ratio,
)
from lightning_grpo.algorithms.statistics import masked_mean

PolicyLossKind = Literal["clip", "gspo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "gpg"]
#: ``(logprobs, old_logprobs, advantages, completion_mask, settings) -> PolicyLossTerms``.
PolicyLossFunction = Callable[[Tensor, Tensor, Tensor, Tensor, "PolicyLossSettings"], "PolicyLossTerms"]

__all__ = [
    "POLICY_LOSS",
    "POLICY_LOSSES",
    "PolicyLossFunction",
    "PolicyLossKind",
    "PolicyLossSettings",
    "PolicyLossStats",
    "PolicyLossTerms",
    "check_clip_args",
    "loss_settings",
    "policy_loss",
]


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy-loss evaluation, each a 0-dim tensor (masked mean over valid tokens).

    Attributes:
        clip_frac: Tokens where the clipped branch of the surrogate is taken.
        clip_frac_low: Tokens with ``A < 0`` and ``ratio < 1 - clip_low``.
        clip_frac_high: Tokens with ``A > 0`` and ``ratio > 1 + clip_high``.
        dual_clip_frac: Tokens where the dual clip bound ``-A * dual_clip`` is taken.
        approx_kl: ``mean(old_logprobs - logprobs)``, the k1 estimate of ``KL(old || current)``.
        extra: The loss's own diagnostics (:attr:`PolicyLossTerms.metrics`), each reduced to a 0-dim mean.
    """

    clip_frac: Tensor
    clip_frac_low: Tensor
    clip_frac_high: Tensor
    dual_clip_frac: Tensor
    approx_kl: Tensor
    extra: Mapping[str, Tensor] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, Tensor]:
        """Every diagnostic by its logged name (``clip_frac``, ..., then the loss's own)."""
        fixed = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**fixed, **self.extra}


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, dual_clip: float | None, delta: float | None
) -> PolicyLossTerms:
    unclipped_ratio = ratio if delta is None else ratio.clamp(max=delta)
    loss_unclipped = -advantages * unclipped_ratio  # (N, T)
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (N, T)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_clipped, bound, loss)
    return PolicyLossTerms(loss, ratio, clipped, dual_clipped)


# Every loss shares one call: (logprobs, old_logprobs, advantages, mask, settings) -> PolicyLossTerms, with
# advantages (N, 1) or (N, T) and old_logprobs detached; its own settings are the keyword-only parameters
# (components.py), which default to GRPOConfig's fields of the same names.
def _clip(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    delta: float | None = None,
) -> PolicyLossTerms:
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))  # (N, T)
    return _clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip, delta)


def _gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    delta: float | None = None,
) -> PolicyLossTerms:
    valid = mask.bool()
    log_ratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))  # (N, T), padding ignored
    seq_log_ratio = log_ratio.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
    token_log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()  # value: sequence; gradient: token
    ratio = torch.exp(token_log_ratio.clamp(max=MAX_SEQ_LOG_RATIO))  # (N, T)
    return _clipped_surrogate(ratio, advantages, clip_low, clip_high, None, delta)


def _cispo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> PolicyLossTerms:
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))  # (N, T)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    weight = torch.where(mask.bool(), weight, torch.zeros_like(weight))  # padding carries no gradient
    clipped = weight != ratio.detach()
    return PolicyLossTerms(-advantages * weight * logprobs, ratio, clipped)


#: Read-only catalogue of the built-in losses: kind -> function of one shared signature. ``loss_kind`` may also be
#: the import path of a function of that signature (:mod:`~lightning_grpo.algorithms.catalogue`).
POLICY_LOSSES: Mapping[str, PolicyLossFunction] = MappingProxyType(
    {
        "clip": _clip,
        "gspo": _gspo,
        "cispo": _cispo,
        "sapo": soft_losses.sapo,
        "gmpo": soft_losses.gmpo,
        "dppo_tv": divergence_losses.dppo_tv,
        "dppo_kl": divergence_losses.dppo_kl,
        "clip_cov": covariance_losses.clip_cov,
        "kl_cov": covariance_losses.kl_cov,
        "gpg": soft_losses.gpg,
    }
)
#: The role of a policy loss: how a component named by ``loss_kind`` (with ``loss_kind_args``) is built and called.
POLICY_LOSS = ComponentRole(
    "policy loss kind",
    POLICY_LOSSES,
    ("logprobs", "old_logprobs", "advantages", "completion_mask", "settings"),
    "PolicyLossTerms",
)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    kind: PolicyLossKind | str = "clip",
    kind_args: Mapping[str, Any] | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    delta: float | None = None,
    seed: int | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """Per-token policy loss and its clipping diagnostics.

    Args:
        logprobs: ``(N, T)`` log-probs of the sampled tokens under the current policy (carries the gradient).
        old_logprobs: ``(N, T)`` log-probs under the policy that sampled them (no gradient).
        advantages: ``(N,)`` per-sequence or ``(N, T)`` per-token advantages.
        completion_mask: ``(N, T)`` valid-token mask (used by the statistics and by ``gspo``'s sequence mean).
        kind: A name of :data:`POLICY_LOSSES` (``"clip"``, ``"gspo"``, ``"sapo"``, ...), or the import path of a
            :data:`PolicyLossFunction` (or a class whose instances are one).
        kind_args: The loss's own settings (its keyword-only parameters, or its class's ``__init__`` arguments);
            those named like ``clip_low``, ``clip_high``, ``dual_clip``, ``delta`` replace these arguments.
        clip_low: Lower clip range: the ratio is clipped at ``1 - clip_low``.
        clip_high: Upper clip range: the ratio is clipped at ``1 + clip_high`` (DAPO's clip-higher when larger).
        dual_clip: Bound ``c`` of dual clip for ``A < 0`` (``clip`` only); ``None`` disables it.
        delta: INTELLECT-2 upper bound on the ratio in the unclipped term; ``None`` disables it.
        seed: Seed of the loss's random choices (``clip_cov``), the step's seed; ``None``: torch's global one.

    Returns:
        ``(per_token_loss, stats)``: the ``(N, T)`` loss (padding not yet masked) and :class:`PolicyLossStats`.

    Raises:
        ValueError: Unknown ``kind``, settings it does not take, invalid clip settings, or mismatched shapes.

    Example::

        >>> lp = torch.tensor([[0.0, -1.0]]); old = torch.tensor([[-0.5, -1.0]]); m = torch.ones(1, 2)
        >>> loss, stats = policy_loss(lp, old, torch.tensor([1.0]), m)  # ratio e^0.5 = 1.65 clipped to 1.2
        >>> loss
        tensor([[-1.2000, -1.0000]])
    """
    settings = loss_settings(
        kind_args, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, delta=delta, seed=seed
    )
    defaults = vars(replace(settings, seed=None))  # as GRPOConfig.component's: built once, whatever the seed
    compute = build_component(POLICY_LOSS, kind, kind_args, defaults=defaults)
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, completion_mask=completion_mask)
    if advantages.ndim == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages[:, None]  # (N, 1) broadcasts over tokens
    elif advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be (N,) or (N, T) matching logprobs {tuple(logprobs.shape)}; "
            f"got {tuple(advantages.shape)}"
        )
    old_logprobs = old_logprobs.detach()
    terms = compute(logprobs, old_logprobs, advantages, completion_mask, settings)
    return terms.loss, _stats(logprobs, old_logprobs, advantages, completion_mask, terms, settings)


def loss_settings(kind_args: Mapping[str, Any] | None, **flat: Any) -> PolicyLossSettings:
    """The :class:`PolicyLossSettings` in effect: the flat ``clip_low``, ... with those the loss's args give instead.

    Raises:
        ValueError: A clip setting out of range (:func:`check_clip_args`).
    """
    names = [field.name for field in fields(PolicyLossSettings)]
    given = {name: value for name, value in (kind_args or {}).items() if name in names}
    return PolicyLossSettings(**{**{name: flat[name] for name in names if name in flat}, **given})


@torch.no_grad()
def _stats(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    terms: PolicyLossTerms,
    settings: PolicyLossSettings,
) -> PolicyLossStats:
    """Clipping diagnostics, as in cleanrl's ``ppo.py`` (https://github.com/vwxyzjn/cleanrl)."""
    ratio, none = terms.ratio, torch.zeros_like(terms.ratio, dtype=torch.bool)
    a = advantages.expand_as(ratio)
    low = (a < 0) & (ratio < 1.0 - settings.clip_low)
    high = (a > 0) & (ratio > 1.0 + settings.clip_high)
    clipped = none if terms.clipped is None else terms.clipped
    dual_clipped = none if terms.dual_clipped is None else terms.dual_clipped
    return PolicyLossStats(
        clip_frac=masked_mean(clipped.float(), mask),
        clip_frac_low=masked_mean(low.float(), mask),
        clip_frac_high=masked_mean(high.float(), mask),
        dual_clip_frac=masked_mean(dual_clipped.float(), mask),
        approx_kl=masked_mean((old_logprobs - logprobs).float(), mask),
        extra=_own_metrics(terms.metrics, mask),
    )


#: Names the objective logs itself: a loss's own metric may not take one.
_RESERVED = frozenset(
    {"loss", "pg_loss", "kl", "entropy", "clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl"}
)


def _own_metrics(metrics: Mapping[str, Tensor] | None, mask: Tensor) -> dict[str, Tensor]:
    taken = sorted(_RESERVED & set(metrics or {}))
    if taken:
        raise ValueError(
            f"a policy loss's metrics may not be named {', '.join(map(repr, taken))}: the objective "
            "logs those itself; rename them"
        )
    return {name: _mean(value, mask) for name, value in (metrics or {}).items()}


def _mean(value: Tensor, mask: Tensor) -> Tensor:
    """A loss's own metric: an ``(N, T)`` one is averaged over valid tokens, a 0-dim one is kept."""
    value = value.detach().float()
    return value if value.ndim == 0 else masked_mean(value.expand(mask.shape), mask)
