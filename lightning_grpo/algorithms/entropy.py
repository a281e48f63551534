"""Entropy control: the entropy bonus's coefficient (constant or adaptive) and top-entropy token selection.

The objective subtracts ``c · H`` (``H`` the aggregated per-token entropy of the loss tokens). ``c`` comes from an
**entropy control** component (``GRPOConfig.objective.entropy_control`` + ``entropy_control_args``), called once per
training step with the step's global mean entropy ``e`` (the logged ``train/entropy``, reduced over all ranks, so every
rank computes the same ``c``) and returning the coefficient of the next step:

* ``constant``: ``c = entropy_coef`` always (the bonus of earlier releases).
* ``adaptive`` (Skywork-OR1, He et al. 2025, arXiv:2505.22312, §3.2; TRL ``use_adaptive_entropy``): a state
  ``c_k``, moved by ``delta`` toward more entropy when ``e_k < target`` and less otherwise, kept in
  ``[coef_min, coef_max]``; the bonus applies only while ``e_k <= target``::

      c_{k+1} = clip(c_k + delta · sign(target - e_k), coef_min, coef_max)
      coefficient of step k+1 = c_{k+1} · 1[e_k <= target]

  Before any step has been measured the coefficient is 0 (TRL's convention). Its state is saved in checkpoints.

A component of your own is a function ``f(entropy: float | None) -> float`` (``None``: no step measured yet) or a
class whose instances are one; a class with ``state_dict``/``load_state_dict`` has its state checkpointed.

**Top-entropy selection** (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv:2506.01939; TRL
``top_entropy_quantile``): only the tokens whose entropy is at least the ``1 - ρ`` quantile of the loss tokens keep
their policy loss (and entropy bonus); the others count in the normalisers but carry no policy gradient. The
bonus is aggregated like the policy loss, over all loss tokens; TRL divides it by the selected tokens only
(``token_selection_args: {entropy_over: selected}``, :mod:`~lightning_grpo.algorithms.peer_normalisers`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms.components import ComponentRole, build_component

__all__ = [
    "ENTROPY_CONTROL",
    "ENTROPY_CONTROLS",
    "AdaptiveEntropy",
    "EntropyControlKind",
    "constant_entropy",
    "entropy_controller",
    "top_entropy_mask",
]

EntropyControlKind = Literal["constant", "adaptive"]


def constant_entropy(entropy: float | None, *, entropy_coef: float = 0.0) -> float:
    """The coefficient ``entropy_coef`` whatever the entropy (``GRPOConfig.objective.entropy_coef``)."""
    return entropy_coef


class AdaptiveEntropy:
    """Skywork-OR1's adaptive entropy coefficient (module docstring); its state is ``coef`` and ``entropy``.

    Args:
        target: The target entropy in nats (TRL ``entropy_target``; TRL's default 0.2).
        delta: Step of the coefficient per training step (TRL ``entropy_coef_delta``, 0.005).
        coef_min: Lower bound of the coefficient (TRL ``entropy_coef_min``, 0).
        coef_max: Upper bound (TRL ``entropy_coef_max``, 1).
        entropy_coef: The starting coefficient ``c_0`` (``GRPOConfig.objective.entropy_coef`` unless given here).

    Example::

        >>> control = AdaptiveEntropy(target=0.5, delta=0.1)
        >>> control(None), control(0.3), control(0.3), control(0.9)  # no measure yet; below, below; above
        (0.0, 0.1, 0.2, 0.0)
    """

    def __init__(
        self,
        target: float = 0.2,
        delta: float = 0.005,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
        entropy_coef: float = 0.0,
    ) -> None:
        for name, value in (("target", target), ("delta", delta), ("coef_min", coef_min), ("coef_max", coef_max)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"entropy_control_args.{name} must be a finite number >= 0, got {value!r}")
        if coef_min > coef_max:
            raise ValueError(
                f"entropy_control_args: coef_min={coef_min} > coef_max={coef_max}; give coef_min <= coef_max"
            )
        self.target, self.delta, self.coef_min, self.coef_max = float(target), float(delta), coef_min, coef_max
        self.coef = min(max(float(entropy_coef), coef_min), coef_max)
        self.entropy: float | None = None  # the last measured entropy

    def __call__(self, entropy: float | None) -> float:
        """Update with the step's entropy (``None``: no update) and return the next step's coefficient."""
        if entropy is not None and math.isfinite(entropy):
            step = self.delta if entropy < self.target else -self.delta if entropy > self.target else 0.0
            self.coef = min(max(self.coef + step, self.coef_min), self.coef_max)
            self.entropy = float(entropy)
        if self.entropy is None or self.entropy > self.target:
            return 0.0
        return self.coef

    def state_dict(self) -> dict[str, Any]:
        """The coefficient and the last entropy (plain floats: ``torch.load(weights_only=True)`` reads them)."""
        return {"coef": self.coef, "entropy": self.entropy}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.coef, self.entropy = float(state["coef"]), state["entropy"]


#: Read-only catalogue of the built-in entropy controls; ``entropy_control`` may also be an import path.
ENTROPY_CONTROLS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {"constant": constant_entropy, "adaptive": AdaptiveEntropy}
)
#: The role of an entropy control: how ``entropy_control`` (with ``entropy_control_args``) is built.
ENTROPY_CONTROL = ComponentRole("entropy control", ENTROPY_CONTROLS, ("entropy",), "float")


def entropy_controller(
    kind: str, args: Mapping[str, Any] | None, entropy_coef: float, *, shared: bool = True
) -> Callable[[float | None], float]:
    """The entropy control ``kind`` with its ``args``; ``entropy_coef`` fills an ``entropy_coef`` setting left out.

    ``shared=False`` builds a fresh instance (a module's own, whose state is checkpointed) instead of the cached one.
    """
    if not shared:
        from lightning_grpo.algorithms.catalogue import choose

        target = choose(ENTROPY_CONTROLS, kind, ENTROPY_CONTROL.what, import_paths=True)
        if isinstance(target, type):
            build_component(ENTROPY_CONTROL, kind, args, {"entropy_coef": entropy_coef})  # checks the settings
            takes_coef = "entropy_coef" in _init_parameters(target)
            given = {**({"entropy_coef": entropy_coef} if takes_coef else {}), **dict(args or {})}
            return target(**given)
    return build_component(ENTROPY_CONTROL, kind, args, {"entropy_coef": entropy_coef})


def controller_state(control: Callable[[float | None], float], coef: float) -> dict[str, Any]:
    """What a checkpoint holds of the entropy control: the coefficient in use and the control's own state."""
    return {"coef": coef, "state": getattr(control, "state_dict", dict)()}


def restore_controller(control: Callable[[float | None], float], saved: Mapping[str, Any] | None) -> float | None:
    """Load :func:`controller_state`'s ``saved`` into ``control``; the saved coefficient, or ``None`` when the
    checkpoint has none for this control (then the coefficient stays as built)."""
    if saved is None or type(saved["state"]) is not dict or not hasattr(control, "load_state_dict"):
        return None
    control.load_state_dict(saved["state"])  # type: ignore[attr-defined]
    return float(saved["coef"])


def _init_parameters(target: type) -> set[str]:
    import inspect

    return set(inspect.signature(target).parameters)


@torch.no_grad()
def top_entropy_mask(entropy: Tensor, loss_mask: Tensor, quantile: float) -> Tensor:
    """``(n, T)`` bool: the loss tokens whose entropy is at least the ``1 - quantile`` quantile of the loss tokens.

    The quantile is ``torch.quantile``'s (linear interpolation), as TRL's ``get_high_entropy_mask``; ``quantile=1``
    keeps every loss token.

    Example::

        >>> entropy = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7]])
        >>> top_entropy_mask(entropy, torch.ones(1, 5), 0.4)  # the 0.6 quantile is 0.58: 0.9 and 0.7 stay
        tensor([[False,  True, False, False,  True]])
    """
    if not (0.0 < quantile <= 1.0):
        raise ValueError(f"top_entropy: quantile must be in (0, 1], got {quantile!r}; 0.2 is the paper's choice")
    mask = loss_mask.bool()
    values = entropy.detach()[mask].double()
    if values.numel() == 0:
        return mask
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropy.detach().double() >= threshold) & mask
