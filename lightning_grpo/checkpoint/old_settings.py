"""The ``grpo`` settings of an older checkpoint in today's names, so that it resumes without reported changes.

Before issue 53 the off-policy corrections were flat ``GRPOConfig`` fields; they are now components with their own
settings (``lightning_grpo.algorithms.corrections``). A checkpoint saved with the flat fields maps as:

* ``tis_cap: C`` -> ``rollout_correction: token_truncate``, ``rollout_correction_args: {max: C}``;
* ``rollout_correction_min``/``_max`` -> ``rollout_correction_args: {min, max}``;
* ``rollout_rejection_min``/``_max`` -> ``rollout_rejection_args: {min, max}``;
* ``off_policy_mask_threshold: δ`` -> ``off_policy_mask: opsm``, ``off_policy_mask_args: {threshold: δ}``;
* ``importance_weighted_kl: true`` -> ``kl_weighting: importance``;
* ``top_entropy_quantile: ρ`` (< 1) -> ``token_selection: top_entropy``, ``token_selection_args: {quantile: ρ}``.

Before issue 63 every setting was a flat field; they are now grouped by concern (``lightning_grpo.config``), and a
flat checkpoint's settings move into their groups (``temperature`` -> ``sampling.temperature``,
``val_temperature`` -> ``validation.temperature``: ``MOVED_SETTINGS``). A setting this version no longer knows is
kept at the top level, where the report of changed settings names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_grpo.config import MOVED_SETTINGS

__all__ = ["FLAT_CORRECTION_KEYS", "upgrade_grpo_settings"]

#: The flat settings replaced by correction components.
FLAT_CORRECTION_KEYS = (
    "tis_cap",
    "rollout_correction_min",
    "rollout_correction_max",
    "rollout_rejection_min",
    "rollout_rejection_max",
    "off_policy_mask_threshold",
    "importance_weighted_kl",
    "top_entropy_quantile",
)


def upgrade_grpo_settings(saved: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` (a checkpoint's ``hyper_parameters["grpo"]``) in today's form: flat correction settings mapped to
    components, then every flat setting moved into its group.

    Settings already in today's form are returned unchanged.

    Example::

        >>> upgrade_grpo_settings({"tis_cap": 2.0, "rollout_correction": None, "top_entropy_quantile": 1.0})
        {'corrections': {'rollout_correction': 'token_truncate', 'rollout_correction_args': {'max': 2.0}}}
        >>> upgrade_grpo_settings({"val_temperature": 0.6, "sampling": {"temperature": 0.9}})
        {'validation': {'temperature': 0.6}, 'sampling': {'temperature': 0.9}}
    """
    grouped: dict[str, Any] = {}
    for key, value in _upgrade_corrections(saved).items():
        if key in MOVED_SETTINGS:
            group, name = MOVED_SETTINGS[key].split(".")
            grouped.setdefault(group, {})[name] = value
        elif isinstance(value, Mapping) and isinstance(grouped.get(key), dict):
            grouped[key] = {**value, **grouped[key]}
        else:
            grouped[key] = dict(value) if isinstance(value, Mapping) else value
    return grouped


def _upgrade_corrections(saved: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` with the flat correction settings (before issue 53) mapped to components, still flat."""
    if not any(key in saved for key in FLAT_CORRECTION_KEYS):
        return dict(saved)
    old = dict(saved)
    new = {key: value for key, value in old.items() if key not in FLAT_CORRECTION_KEYS}
    mode = old.get("rollout_correction")
    if old.get("tis_cap") is not None:
        new["rollout_correction"], new["rollout_correction_args"] = "token_truncate", {"max": old["tis_cap"]}
    elif mode is not None:
        new["rollout_correction_args"] = {
            "min": old.get("rollout_correction_min"),
            "max": old.get("rollout_correction_max", 3.0),
        }
    if old.get("rollout_rejection") is not None:
        new["rollout_rejection_args"] = {
            "min": old.get("rollout_rejection_min", 0.5),
            "max": old.get("rollout_rejection_max", 2.0),
        }
    if old.get("off_policy_mask_threshold") is not None:
        new["off_policy_mask"], new["off_policy_mask_args"] = "opsm", {"threshold": old["off_policy_mask_threshold"]}
    if old.get("importance_weighted_kl"):
        new["kl_weighting"] = "importance"
    if old.get("top_entropy_quantile", 1.0) < 1.0:
        new["token_selection"], new["token_selection_args"] = "top_entropy", {"quantile": old["top_entropy_quantile"]}
    return new
