"""Cross-field checks of the entropy-control, rollout-correction and off-policy settings of ``GRPOConfig``.

One call from ``GRPOConfig.__post_init__``; each error names the settings involved and the fix.
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.algorithms.entropy import entropy_controller
from lightning_grpo.settings_checks import SettingError

__all__ = ["check_off_policy_settings"]


def check_off_policy_settings(config: Any) -> None:
    """Refuse combinations of ``config``'s settings that cannot work (see each message).

    Raises:
        SettingError: ``tis_cap`` with ``rollout_correction``; a ``*_truncate`` mode with no bound; a band whose
            minimum exceeds its maximum; rollout correction with ``old_logprobs="rollout"``.
        ValueError: An unknown ``entropy_control`` or settings it does not take.
    """
    entropy_controller(config.entropy_control, config.entropy_control_args, config.entropy_coef)  # builds: checks
    config.entropy_control = str(config.entropy_control)
    mode = config.rollout_correction
    if mode is not None and config.tis_cap is not None:
        raise SettingError(
            f"tis_cap={config.tis_cap} and rollout_correction={mode!r} are both set: tis_cap C is rollout_correction "
            "'token_truncate' with rollout_correction_max C; keep one of them",
            "tis_cap",
            config.tis_cap,
        )
    low, high = config.rollout_correction_min, config.rollout_correction_max
    if mode is not None and mode.endswith("_truncate") and low is None and high is None:
        raise SettingError(
            f"rollout_correction={mode!r} truncates the weights, but rollout_correction_min and "
            "rollout_correction_max are both null; set at least one (3.0 is TRL's max)",
            "rollout_correction",
            mode,
        )
    _check_band("rollout_correction", low, high)
    _check_band("rollout_rejection", config.rollout_rejection_min, config.rollout_rejection_max)
    corrects = mode is not None or config.rollout_rejection is not None
    if corrects and config.old_logprobs == "rollout":
        raise SettingError(
            f"rollout_correction={mode!r} / rollout_rejection={config.rollout_rejection!r} with old_logprobs="
            "'rollout': the old log-probs are then the sampler's, so every ratio is 1 and nothing is corrected; use "
            "old_logprobs='recompute' or turn the correction off",
            "old_logprobs",
            config.old_logprobs,
        )


def _check_band(name: str, low: float | None, high: float | None) -> None:
    if low is not None and high is not None and low > high:
        raise SettingError(
            f"{name}_min={low} > {name}_max={high}: the band is empty; give {name}_min <= {name}_max",
            f"{name}_min",
            low,
        )
