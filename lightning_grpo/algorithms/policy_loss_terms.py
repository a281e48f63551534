"""What every policy loss receives and returns: :class:`PolicyLossSettings` and :class:`PolicyLossTerms`.

A module of its own so that the files of built-in losses (:mod:`~lightning_grpo.algorithms.policy_losses`,
:mod:`~lightning_grpo.algorithms.soft_losses`, :mod:`~lightning_grpo.algorithms.divergence_losses`,
:mod:`~lightning_grpo.algorithms.covariance_losses`) import it without importing the catalogue that lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from lightning_grpo.settings_checks import check_number

__all__ = ["PolicyLossSettings", "PolicyLossTerms", "check_clip_args", "log_ratio", "with_settings_check"]

MAX_LOG_RATIO = 20.0
MAX_SEQ_LOG_RATIO = 10.0
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class PolicyLossSettings:
    """The settings every policy loss receives (each uses those it needs).

    Attributes:
        clip_low: The ratio is clipped below at ``1 - clip_low``.
        clip_high: The ratio is clipped above at ``1 + clip_high`` (DAPO's clip-higher when larger).
        dual_clip: Bound ``c`` of dual clip for ``A < 0``; ``None`` disables it.
        delta: INTELLECT-2 upper bound on the ratio in the unclipped term; ``None`` disables it.
        seed: Seed of a loss's random choices (``clip_cov``'s token choice): the training step's seed
            (``GRPOModule._iteration_seed``); ``None``: torch's global generator.

    Raises:
        TypeError: A value is not a number.
        ValueError: A value is NaN, infinite or out of range (:func:`check_clip_args`).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    delta: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        check_clip_args(self.clip_low, self.clip_high, self.dual_clip, self.delta)

    def generator(self, device: torch.device) -> torch.Generator | None:
        """A generator on ``device`` seeded with :attr:`seed`; ``None`` when no seed was given."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


@dataclass(frozen=True)
class PolicyLossTerms:
    """What a policy loss returns: the per-token loss and what its clipping diagnostics are computed from.

    Attributes:
        loss: ``(N, T)`` per-token loss, padding not yet masked.
        ratio: ``(N, T)`` importance ratio (``clip_frac_low`` / ``clip_frac_high`` compare it with the clip range).
        clipped: ``(N, T)`` bool, tokens where a clipped branch is taken (``clip_frac``); ``None``: none.
        dual_clipped: ``(N, T)`` bool, tokens where the dual-clip bound is taken (``dual_clip_frac``); ``None``: none.
        metrics: The loss's own diagnostics by name (logged as ``train/<name>``): an ``(N, T)`` tensor is reduced to
            its mean over valid tokens, a 0-dim one is taken as it is (it should be such a mean already), so that
            the update loop's token-weighted sums over micro-batches and ranks give the exact global value.
    """

    loss: Tensor
    ratio: Tensor
    clipped: Tensor | None = None
    dual_clipped: Tensor | None = None
    metrics: Mapping[str, Tensor] | None = None


def check_clip_args(clip_low: float, clip_high: float, dual_clip: float | None, delta: float | None) -> None:
    """Raise unless ``0 <= clip_low < 1``, ``clip_high >= 0``, ``dual_clip > 1`` and ``delta > 1 + clip_high``.

    ``dual_clip`` and ``delta`` may be ``None`` (off). :class:`~lightning_grpo.config.GRPOConfig` checks its settings
    with this function too, so a bad value fails when the config is built, with the same message.

    Raises:
        TypeError: A value is not a number.
        ValueError: A value is NaN, infinite or out of its range.
    """
    check_number("clip_low", clip_low, minimum=0.0, maximum=1.0, exclusive_maximum=True)
    check_number("clip_high", clip_high, minimum=0.0)
    check_number("dual_clip", dual_clip, minimum=1.0, exclusive_minimum=True, allow_none=True)
    check_number("delta", delta, minimum=1.0 + clip_high, exclusive_minimum=True, allow_none=True)


def log_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """``log(π/π_old)`` per token, clamped to ``±20`` (verl's bound) so that ``exp`` stays finite."""
    return (logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def with_settings_check(check: Callable[..., None]) -> Callable[[_F], _F]:
    """Mark a loss function with ``check``, called with its settings when the component is built.

    :func:`~lightning_grpo.algorithms.components.build_component` calls ``check(**settings)`` once, so a setting out
    of range fails when ``GRPOConfig`` is built (``loss_kind_args`` named), not at the first training step.
    """

    def mark(function: _F) -> _F:
        function.check_settings = check  # type: ignore[attr-defined]
        return function

    return mark
