"""The ``grpo`` settings of an older checkpoint in today's names, so that it resumes without reported changes.

Before issue 53 the off-policy corrections were flat ``GRPOConfig`` fields; they are now components with their own
settings (``lightning_grpo.algorithms.corrections``). A checkpoint saved with the flat fields maps as:

* ``tis_cap: C`` -> ``rollout_correction: token_truncate``, ``rollout_correction_args: {max: C}``;
* ``rollout_correction_min``/``_max`` -> ``rollout_correction_args: {min, max}``;
* ``rollout_rejection_min``/``_max`` -> ``rollout_rejection_args: {min, max}``;
* ``off_policy_mask_threshold: δ`` -> ``off_policy_mask: opsm``, ``off_policy_mask_args: {threshold: δ}``;
* ``importance_weighted_kl: true`` -> ``kl_weighting: importance``;
* ``top_entropy_quantile: ρ`` (< 1) -> ``token_selection: top_entropy``, ``token_selection_args: {quantile: ρ}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["FLAT_CORRECTION_KEYS", "upgrade_grpo_settings"]

#: The flat settings replaced by correction components.
FLAT_CORRECTION_KEYS = (
    "tis_cap", "rollout_correction_min", "rollout_correction_max", "rollout_rejection_min", "rollout_rejection_max",
    "off_policy_mask_threshold", "importance_weighted_kl", "top_entropy_quantile",
)  # fmt: skip


def upgrade_grpo_settings(saved: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` (a checkpoint's ``hyper_parameters["grpo"]``) with the flat correction settings mapped to components.

    Settings already in today's form are returned unchanged.

    Example::

        >>> upgrade_grpo_settings({"tis_cap": 2.0, "rollout_correction": None, "top_entropy_quantile": 1.0})
        {'rollout_correction': 'token_truncate', 'rollout_correction_args': {'max': 2.0}}
    """
    if not any(key in saved for key in FLAT_CORRECTION_KEYS):
        return dict(saved)
    old = dict(saved)
    new = {key: value for key, value in old.items() if key not in FLAT_CORRECTION_KEYS}
    mode = old.get("rollout_correction")
    if old.get("tis_cap") is not None:
        new["rollout_correction"], new["rollout_correction_args"] = "token_truncate", {"max": old["tis_cap"]}
    elif mode is not None:
        new["rollout_correction_args"] = {"min": old.get("rollout_correction_min"),
                                          "max": old.get("rollout_correction_max", 3.0)}  # fmt: skip
    if old.get("rollout_rejection") is not None:
        new["rollout_rejection_args"] = {"min": old.get("rollout_rejection_min", 0.5),
                                         "max": old.get("rollout_rejection_max", 2.0)}  # fmt: skip
    if old.get("off_policy_mask_threshold") is not None:
        new["off_policy_mask"], new["off_policy_mask_args"] = "opsm", {"threshold": old["off_policy_mask_threshold"]}
    if old.get("importance_weighted_kl"):
        new["kl_weighting"] = "importance"
    if old.get("top_entropy_quantile", 1.0) < 1.0:
        new["token_selection"], new["token_selection_args"] = "top_entropy", {"quantile": old["top_entropy_quantile"]}
    return new
