"""Off-policy corrections as components: rollout correction, rejection, OPSM, the weighted KL, token selection.

Each is chosen by name with settings of its own, like the losses and estimators
(:mod:`~lightning_grpo.algorithms.components`): ``rollout_correction`` + ``rollout_correction_args``,
``rollout_rejection`` + ``rollout_rejection_args``, ``off_policy_mask`` + ``off_policy_mask_args``, ``kl_weighting`` +
``kl_weighting_args``, ``token_selection`` + ``token_selection_args``; ``None`` turns one off, an import path names
your own. The formulas are in :mod:`~lightning_grpo.algorithms.rollout_correction`,
:mod:`~lightning_grpo.algorithms.off_policy`, :func:`~lightning_grpo.algorithms.kl.importance_weighted_kl` and
:func:`~lightning_grpo.algorithms.entropy.top_entropy_mask`; docs/math.md, "Rollout correction".

Calls (every built-in is a class whose ``__init__`` takes its settings):

* rollout correction and rejection: ``(per_token, old_logprobs, behaviour_logprobs, loss_mask) -> (per_token,
  metrics)``;
* off-policy mask: ``(per_token, advantages, logprobs, sampler_logprobs, loss_mask) -> (per_token, metrics)``;
* KL weighting: ``(kl, logprobs, old_logprobs, loss_mask) -> kl``;
* token selection: ``(entropy, loss_mask) -> (n, T) float mask``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from torch import Tensor

from lightning_grpo.algorithms.components import ComponentRole, ComponentSettingError, build_component
from lightning_grpo.algorithms.entropy import top_entropy_mask
from lightning_grpo.algorithms.kl import importance_weighted_kl
from lightning_grpo.algorithms.off_policy import off_policy_masked
from lightning_grpo.algorithms.rollout_correction import rejection_keep, rollout_correct
from lightning_grpo.settings_checks import check_choice

__all__ = [
    "KL_WEIGHTING",
    "OFF_POLICY_MASK",
    "OPSM",
    "ROLLOUT_CORRECTION",
    "ROLLOUT_REJECTION",
    "TOKEN_SELECTION",
    "ImportanceWeightedKL",
    "ImportanceWeights",
    "Rejection",
    "TopEntropy",
    "build_correction",
]


def _number(owner: str, name: str, value: Any, *, allow_none: bool = False, positive: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ComponentSettingError(f"{owner}: {name}={value!r} must be a finite number >= 0")
    if positive and value <= 0:
        raise ComponentSettingError(f"{owner}: {name}={value!r} must be > 0")


def _choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    try:
        check_choice(name, value, choices)
    except ValueError as error:
        raise ComponentSettingError(f"{owner}: {error}") from None


def _band(owner: str, low: float | None, high: float | None) -> None:
    if low is not None and high is not None and low > high:
        raise ComponentSettingError(f"{owner}: min={low} > max={high}: the band is empty; give min <= max")


class ImportanceWeights:
    """Detached importance weights ``π_old/π_sampler`` on the policy loss, token or sequence level, truncated to
    ``[min, max]`` or masked to 0 outside it (TRL ``vllm_importance_sampling_mode``; verl ``rollout_is``).

    Args:
        min: Lower bound ``C_min`` (``None``: none).
        max: Upper bound ``C_max`` (``None``: none; 3.0 is TRL's).
    """

    mode: ClassVar[str] = "token_truncate"

    def __init__(self, min: float | None = None, max: float | None = 3.0) -> None:  # the YAML keys
        _number(self.mode, "min", min, allow_none=True)
        _number(self.mode, "max", max, allow_none=True, positive=True)
        _band(self.mode, min, max)
        if self.mode.endswith("_truncate") and min is None and max is None:
            raise ComponentSettingError(f"{self.mode} truncates the weights: give min or max (3.0 is TRL's max)")
        self.low, self.high = min, max

    def __call__(
        self, per_token: Tensor, old_logprobs: Tensor, behaviour_logprobs: Tensor | None, loss_mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        correction = (self.mode, self.low, self.high)
        no_rejection = (None, 0.0, 0.0)
        return rollout_correct(per_token, old_logprobs, behaviour_logprobs, loss_mask, correction, no_rejection)


class TokenTruncate(ImportanceWeights):
    """``w_t = clip(exp(d_t), min, max)`` (truncated IS)."""

    mode = "token_truncate"


class TokenMask(ImportanceWeights):
    """``w_t = exp(d_t)`` inside ``[min, max]``, 0 outside (IcePop-style)."""

    mode = "token_mask"


class SequenceTruncate(ImportanceWeights):
    """``w = clip(exp(Σ_t d_t), min, max)`` on every token of the sequence."""

    mode = "sequence_truncate"


class SequenceMask(ImportanceWeights):
    """``w = exp(Σ_t d_t)`` inside ``[min, max]``, 0 outside (TRL's default mode)."""

    mode = "sequence_mask"


class Rejection:
    """A sequence whose statistic of ``π_old/π_sampler`` is outside ``[min, max]`` loses its policy loss (verl
    ``rollout_rs``; its bounds are on the inverse ratio: verl's ``"lo_hi"`` is ``min: 1/hi, max: 1/lo`` here).

    Args:
        min: Lower bound of the statistic (default 0.5).
        max: Upper bound (default 2.0).
        normalise: The tokens the policy loss's normaliser counts: ``"all"`` (the default: rejected ones too) or
            ``"kept"`` (verl: only the kept sequences', as its response mask without the rejected ones;
            :mod:`~lightning_grpo.algorithms.peer_normalisers`).
    """

    statistic: ClassVar[str] = "geometric"

    def __init__(self, min: float = 0.5, max: float = 2.0, normalise: Literal["all", "kept"] = "all") -> None:
        _number(self.statistic, "min", min)
        _number(self.statistic, "max", max, positive=True)
        _band(self.statistic, min, max)
        _choice(self.statistic, "normalise", normalise, ("all", "kept"))
        self.low, self.high, self.normalise = min, max, normalise

    def keep(self, old_logprobs: Tensor, behaviour_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
        """``(n, 1)`` float: 1 for the sequences kept, 0 for those rejected (:func:`rejection_keep`)."""
        return rejection_keep(old_logprobs, behaviour_logprobs, loss_mask, self.statistic, self.low, self.high)

    def __call__(
        self, per_token: Tensor, old_logprobs: Tensor, behaviour_logprobs: Tensor | None, loss_mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        no_correction = (None, None, None)
        rejection = (self.statistic, self.low, self.high)
        return rollout_correct(per_token, old_logprobs, behaviour_logprobs, loss_mask, no_correction, rejection)


class TokenMeanRejection(Rejection):
    """``s = mean_t exp(d_t)``, the arithmetic mean of the token ratios."""

    statistic = "token_mean"


class GeometricRejection(Rejection):
    """``s = exp(mean_t d_t)``, the geometric mean (verl ``seq_mean_k1``)."""

    statistic = "geometric"


class OPSM:
    """Off-policy sequence masking (DeepSeek-V3.2; TRL ``off_policy_mask_threshold``): a sequence with ``A < 0``
    whose mean ``log π_sampler - log π_θ`` exceeds ``threshold`` loses its policy loss.

    Args:
        threshold: ``δ`` (required, >= 0).
    """

    def __init__(self, threshold: float) -> None:
        _number("opsm", "threshold", threshold)
        self.threshold = float(threshold)

    def __call__(
        self, per_token: Tensor, advantages: Tensor, logprobs: Tensor, sampler_logprobs: Tensor, loss_mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return off_policy_masked(per_token, advantages, logprobs, sampler_logprobs, loss_mask, self.threshold)


class ImportanceWeightedKL:
    """The per-token KL times the ratio ``π_θ/π_old`` (with gradient), DeepSeek-V3.2's unbiased estimate (TRL
    ``use_bias_correction_kl``).

    Args:
        level: ``"token"`` (the paper's: each token's ratio) or ``"sequence"`` (TRL with
            ``importance_sampling_level="sequence"``: the sequence ratio ``exp(mean_t log(π_θ/π_old))`` on every token).
    """

    def __init__(self, level: Literal["token", "sequence"] = "token") -> None:
        if level not in ("token", "sequence"):
            raise ComponentSettingError(
                f"importance: level={level!r} is not valid; choose one of 'token' (the paper), 'sequence' (TRL GSPO)"
            )
        self.level = level

    def __call__(self, kl: Tensor, logprobs: Tensor, old_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
        if self.level == "token":
            return importance_weighted_kl(kl, logprobs, old_logprobs)
        mask = loss_mask.to(logprobs.dtype)
        masked_log_ratio = (logprobs - old_logprobs.detach()) * mask  # (N, T)
        mean = masked_log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
        return kl * mean.exp()


class TopEntropy:
    """Only the loss tokens whose entropy is at least the ``1 - quantile`` quantile keep their policy loss and
    entropy bonus ("Beyond the 80/20 Rule"; TRL ``top_entropy_quantile``).

    Args:
        quantile: ``ρ`` in (0, 1] (default 0.2, the paper's).
        entropy_over: The tokens the entropy bonus is a mean over: ``"loss_tokens"`` (the default: the selected
            tokens' entropy over all loss tokens) or ``"selected"`` (TRL: over the selected tokens;
            :mod:`~lightning_grpo.algorithms.peer_normalisers`).
    """

    def __init__(self, quantile: float = 0.2, entropy_over: Literal["loss_tokens", "selected"] = "loss_tokens") -> None:
        if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0.0 < quantile <= 1.0:
            raise ComponentSettingError(f"top_entropy: quantile={quantile!r} must be in (0, 1]; 0.2 is the paper's")
        _choice("top_entropy", "entropy_over", entropy_over, ("loss_tokens", "selected"))
        self.quantile, self.entropy_over = float(quantile), entropy_over

    def __call__(self, entropy: Tensor, loss_mask: Tensor) -> Tensor:
        return top_entropy_mask(entropy, loss_mask, self.quantile).to(entropy.dtype)


def _role(what: str, catalogue: Mapping[str, Any], call: tuple[str, ...], returns: str) -> ComponentRole:
    return ComponentRole(what, MappingProxyType(dict(catalogue)), call, returns)


_PAIR = "(Tensor, dict[str, Tensor])"
#: The call of a rollout correction and of a rollout rejection.
_SAMPLER_CALL = ("per_token", "old_logprobs", "behaviour_logprobs", "loss_mask")
_CORRECTIONS = {
    "token_truncate": TokenTruncate,
    "token_mask": TokenMask,
    "sequence_truncate": SequenceTruncate,
    "sequence_mask": SequenceMask,
}
_REJECTIONS = {"token_mean": TokenMeanRejection, "geometric": GeometricRejection}
ROLLOUT_CORRECTION = _role("rollout correction", _CORRECTIONS, _SAMPLER_CALL, _PAIR)
ROLLOUT_REJECTION = _role("rollout rejection", _REJECTIONS, _SAMPLER_CALL, _PAIR)
OFF_POLICY_MASK = _role(
    "off-policy mask", {"opsm": OPSM}, ("per_token", "advantages", "logprobs", "sampler_logprobs", "loss_mask"), _PAIR
)
KL_WEIGHTING = _role(
    "KL weighting", {"importance": ImportanceWeightedKL}, ("kl", "logprobs", "old_logprobs", "loss_mask"), "Tensor"
)
TOKEN_SELECTION = _role("token selection", {"top_entropy": TopEntropy}, ("entropy", "loss_mask"), "Tensor")

#: Each correction setting of ``GRPOConfig`` and its role.
ROLES: Mapping[str, ComponentRole] = MappingProxyType(
    {
        "rollout_correction": ROLLOUT_CORRECTION,
        "rollout_rejection": ROLLOUT_REJECTION,
        "off_policy_mask": OFF_POLICY_MASK,
        "kl_weighting": KL_WEIGHTING,
        "token_selection": TOKEN_SELECTION,
    }
)


def build_correction(setting: str, name: str | None, args: Mapping[str, Any] | None) -> Any:
    """The component ``name`` of the correction ``setting`` with ``args`` bound; ``None`` when ``name`` is ``None``.

    Raises:
        ValueError: An unknown name (the valid ones listed), settings it does not take, a bad value.

    Example::

        >>> build_correction("token_selection", "top_entropy", {"quantile": 0.5}).quantile
        0.5
        >>> build_correction("rollout_correction", None, None) is None
        True
    """
    if name is None:
        if args:
            raise ComponentSettingError(f"{setting}_args={dict(args)!r} is set but {setting} is null; set {setting}")
        return None
    return build_component(ROLES[setting], name, args)
