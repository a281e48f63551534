"""Cross-field checks of the entropy-control, rollout-correction and off-policy settings of ``GRPOConfig``.

One call from ``GRPOConfig.__post_init__``; each error names the settings involved and the fix.
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.algorithms.entropy import entropy_controller
from lightning_grpo.settings_checks import SettingError

__all__ = ["check_off_policy_settings"]


def check_off_policy_settings(config: Any) -> None:
    """Refuse combinations of ``config``'s settings that cannot work (see each message); each correction component's
    own settings are checked when it is built (``GRPOConfig.component``).

    Raises:
        SettingError: A rollout correction or rejection with ``old_logprobs="rollout"``.
        ValueError: An unknown ``entropy_control`` or settings it does not take.
    """
    entropy_controller(config.entropy_control, config.entropy_control_args, config.entropy_coef)  # builds: checks
    config.entropy_control = str(config.entropy_control)
    corrects = config.rollout_correction is not None or config.rollout_rejection is not None
    if corrects and config.old_logprobs == "rollout":
        raise SettingError(
            f"rollout_correction={config.rollout_correction!r} / rollout_rejection={config.rollout_rejection!r} with "
            "old_logprobs='rollout': the old log-probs are then the sampler's, so every ratio is 1 and nothing is "
            "corrected; use old_logprobs='recompute' or turn the correction off",
            "old_logprobs",
            config.old_logprobs,
        )
