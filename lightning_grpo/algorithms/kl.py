"""Per-token estimators of ``KL(pi_theta || pi_ref)`` from sampled tokens.

With ``d = ref_logprobs - logprobs`` (Schulman, "Approximating KL Divergence", 2020,
http://joschu.net/blog/kl-approx.html):

* ``k1`` / ``kl``: ``-d`` (unbiased, high variance, can be negative)
* ``abs``: ``|d|``
* ``k2`` / ``mse``: ``0.5 * d**2``
* ``k3`` / ``low_var_kl``: ``exp(d) - d - 1`` (unbiased, non-negative; used by GRPO), ``d`` clamped to ±20 and the
  result to ±10 as in verl.

Appending ``+`` (e.g. ``"k3+"``) keeps the value of the estimator but takes the gradient of k2, whose gradient is an
unbiased estimate of the true KL gradient (straight-through; Liu et al., 2025, arXiv:2510.01555 / verl).

An estimator of your own is a function of ``d`` named by its import path (``kl_estimator: my_project.kl.my_kl``);
its own settings are its keyword-only parameters, given by ``kl_estimator_args``
(:mod:`~lightning_grpo.algorithms.components`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from torch import Tensor

from lightning_grpo.algorithms._checks import check_same_shape
from lightning_grpo.algorithms.components import ComponentRole, build_component

KLEstimator = Literal[
    "k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "kl+", "abs+", "k2+", "mse+", "k3+", "low_var_kl+"
]

__all__ = ["KL_ESTIMATOR", "KL_ESTIMATORS", "KLEstimator", "importance_weighted_kl", "kl_penalty"]


# Every estimator shares one signature: (d) -> per-token value, with d = ref_logprobs - logprobs.
def _k1(d: Tensor) -> Tensor:
    return -d


def _abs(d: Tensor) -> Tensor:
    return d.abs()


def _k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


def _k3(d: Tensor) -> Tensor:
    d = d.clamp(-20.0, 20.0)
    return (d.exp() - d - 1.0).clamp(-10.0, 10.0)


_BASE: Mapping[str, Callable[[Tensor], Tensor]] = {
    "k1": _k1,
    "kl": _k1,
    "abs": _abs,
    "k2": _k2,
    "mse": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}


def _straight_through(base: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    def estimator(d: Tensor) -> Tensor:
        k2 = _k2(d)
        return k2 + (base(d) - k2).detach()  # value of ``base``, gradient of k2

    return estimator


#: Read-only catalogue of the built-in estimators: name -> function of ``d = ref_logprobs - logprobs``; ``kind`` may
#: also be the import path of such a function (:mod:`~lightning_grpo.algorithms.catalogue`).
KL_ESTIMATORS: Mapping[str, Callable[[Tensor], Tensor]] = MappingProxyType(
    {**_BASE, **{f"{name}+": _straight_through(fn) for name, fn in _BASE.items()}}
)

#: The role of a KL estimator: how a component named by ``kl_estimator`` (with ``kl_estimator_args``) is built.
KL_ESTIMATOR = ComponentRole("KL estimator", KL_ESTIMATORS, ("d",), "Tensor")


def kl_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, kind: KLEstimator | str = "k3", kind_args: Mapping[str, Any] | None = None
) -> Tensor:
    """Per-token KL estimate between the policy and the reference policy.

    Args:
        logprobs: ``(N, T)`` log-probs of the sampled tokens under the current policy (carries the gradient).
        ref_logprobs: ``(N, T)`` log-probs of the same tokens under the reference policy.
        kind: Estimator name, see :data:`KL_ESTIMATORS`, or the import path of a function of ``d`` (or of a class
            whose instances are one).
        kind_args: The estimator's own settings (its keyword-only parameters or its class's ``__init__``
            arguments); the built-ins take none.

    Returns:
        ``(N, T)`` per-token penalty (aggregate it with :func:`~lightning_grpo.algorithms.aggregate_loss`).

    Raises:
        ValueError: Unknown ``kind``, settings it does not take, or mismatched shapes.

    Example::

        >>> kl_penalty(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), "k3")  # exp(-0.5) + 0.5 - 1
        tensor([[0.1065]])
    """
    estimator = build_component(KL_ESTIMATOR, kind, kind_args)
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return estimator(ref_logprobs - logprobs)


def importance_weighted_kl(kl: Tensor, logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """The ``(N, T)`` per-token KL times the ratio ``π_θ/π_old`` (with gradient): DeepSeek-V3.2's unbiased estimate.

    Samples come from ``π_old``, so ``E_{π_old}[(π_θ/π_old) · k]`` is the KL under ``π_θ`` (DeepSeek-V3.2,
    arXiv:2512.02556, §"Unbiased KL estimate"; TRL ``use_bias_correction_kl``, slime ``--use-unbiased-kl``). The
    ratio is differentiable, so the gradient changes even where it is 1 (on-policy). The ratio is the token's
    whatever the policy loss: with ``gspo`` TRL (``importance_sampling_level="sequence"``) weights by the sequence
    ratio instead.

    Example::

        >>> importance_weighted_kl(torch.tensor([[0.5]]), torch.tensor([[-1.0]]), torch.tensor([[-1.5]]))
        tensor([[0.8244]])
    """
    check_same_shape(kl=kl, logprobs=logprobs, old_logprobs=old_logprobs)
    return kl * (logprobs - old_logprobs.detach()).exp()
