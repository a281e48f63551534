"""The algorithm's settings in ``GRPOConfig``: the loss (``grpo.objective``), the advantages (``grpo.advantages``) and
the off-policy corrections (``grpo.corrections``). Each component is chosen from an open catalogue (a built-in name
or an import path) with its own settings in ``<name>_args`` (docs/configuration.md, "Components and their
settings")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from jsonargparse.typing import restricted_string_type

from lightning_grpo.algorithms.advantages import AdvantageEstimator, AdvantageScale, estimator_needs
from lightning_grpo.algorithms.aggregation import LossAggMode
from lightning_grpo.algorithms.catalogue import IMPORT_PATH_PATTERN
from lightning_grpo.algorithms.entropy import EntropyControlKind, entropy_controller
from lightning_grpo.algorithms.kl import KLEstimator
from lightning_grpo.algorithms.policy_losses import PolicyLossKind, PolicyLossSettings, loss_settings
from lightning_grpo.algorithms.rollout_correction import RolloutCorrection, RolloutRejection
from lightning_grpo.config.checks import COUNT, OPTIONAL_COUNT, NumberRules, check_components, check_group
from lightning_grpo.settings_checks import SettingError

__all__ = ["AdvantageConfig", "CorrectionConfig", "ImportPath", "ObjectiveConfig"]

#: The import path of a user's function (``my_project.losses.my_loss``): for the command line's type checks, a name
#: that is neither a built-in nor dotted fails when the config is parsed. Stored as a plain ``str``.
ImportPath = restricted_string_type("ImportPath", IMPORT_PATH_PATTERN)


@dataclass
class ObjectiveConfig:
    """The loss of one micro-batch: ``aggregate(policy loss) + kl_coef·aggregate(KL) − c_ent·aggregate(entropy)``
    (docs/math.md), with the clip bounds, the KL estimator, the aggregation and the entropy bonus."""

    owner: ClassVar[str] = "GRPOConfig.objective"
    rules: ClassVar[NumberRules] = {
        "kl_coef": {"minimum": 0.0},
        "loss_agg_norm": OPTIONAL_COUNT,
        "entropy_coef": {"minimum": 0.0},
    }

    loss_kind: PolicyLossKind | ImportPath = "clip"
    """Policy loss: ``"clip"`` (PPO/GRPO clipped surrogate), ``"gspo"``, ``"cispo"``, ``"sapo"``, ``"gmpo"``,
    ``"dppo_tv"``, ``"dppo_kl"``, ``"clip_cov"``, ``"kl_cov"``, ``"gpg"`` (docs/math.md), or your own's import path."""
    loss_kind_args: dict[str, Any] | None = None
    """The policy loss's own settings (keyword arguments of its function or class, e.g. ``{beta: 0.1}``); a clip
    setting the loss takes and this leaves out comes from the fields below. An unknown key is an error."""
    clip_low: float = 0.2
    """Ratio clipped below at ``1 - clip_low`` (verl ``clip_ratio_low``, TRL ``epsilon``)."""
    clip_high: float = 0.2
    """Ratio clipped above at ``1 + clip_high``; larger than ``clip_low`` is DAPO's clip-higher."""
    dual_clip: float | None = 3.0
    """Dual-clip bound ``c`` for negative advantages (verl ``clip_ratio_c``); ``None`` disables it."""
    delta: float | None = None
    """INTELLECT-2 upper bound on the ratio; ``None`` disables it."""
    kl_coef: float = 0.001
    """Weight β of the KL loss to the reference policy; 0 skips the reference forward entirely."""
    kl_estimator: KLEstimator | ImportPath = "k3"
    """``"k1"``, ``"k2"``, ``"k3"`` (= ``"low_var_kl"``), ``"abs"``, any with ``"+"``, or your own's import path."""
    kl_estimator_args: dict[str, Any] | None = None
    """The KL estimator's own settings (the built-ins take none)."""
    kl_weighting: Literal["importance"] | ImportPath | None = None
    """``"importance"``: the per-token KL times ``π_θ/π_old`` (DeepSeek-V3.2; TRL ``use_bias_correction_kl``);
    ``None``: off."""
    kl_weighting_args: dict[str, Any] | None = None
    """Its settings: ``level``, ``"token"`` (the paper's) or ``"sequence"`` (TRL's GSPO)."""
    loss_agg_mode: LossAggMode = "token-mean"
    """``"token-mean"``, ``"token-sum"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
    ``"seq-mean-token-sum-norm"``."""
    loss_agg_norm: int | None = None
    """Divisor of ``seq-mean-token-sum-norm`` (tokens); ``None`` uses ``sampling.max_new_tokens``."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus (0 = none; the entropy is still logged, without gradient)."""
    entropy_control: EntropyControlKind | ImportPath = "constant"
    """What sets the entropy coefficient each iteration: ``"constant"`` (``entropy_coef``), ``"adaptive"``
    (Skywork-OR1, toward ``entropy_control_args.target``; TRL ``use_adaptive_entropy``), or your own's import path."""
    entropy_control_args: dict[str, Any] | None = None
    """Its settings; ``"adaptive"``: ``target`` (0.2 nats), ``delta`` (0.005), ``coef_min`` (0), ``coef_max`` (1),
    ``entropy_coef`` (the start; ``entropy_coef`` above unless given)."""
    token_selection: Literal["top_entropy"] | ImportPath | None = None
    """Which loss tokens keep their policy loss and entropy bonus: ``"top_entropy"`` ("Beyond the 80/20 Rule"; TRL
    ``top_entropy_quantile``), your own by import path, or ``None``: all."""
    token_selection_args: dict[str, Any] | None = None
    """Its settings; ``"top_entropy"``: ``quantile`` in (0, 1] (0.2, per micro-batch) and ``entropy_over``, the
    tokens the entropy bonus is a mean over: ``"loss_tokens"`` (the default) or ``"selected"`` (TRL's)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit ``sampling.max_new_tokens`` out of the loss (DAPO)."""

    def __post_init__(self) -> None:
        with check_group(self):
            check_components(self, ("loss_kind", "kl_estimator", "kl_weighting", "token_selection"))
            entropy_controller(self.entropy_control, self.entropy_control_args, self.entropy_coef)  # builds: checks
            self.entropy_control = str(self.entropy_control)
            self.policy_loss_settings()  # the clip settings in effect are in range

    def policy_loss_settings(self) -> PolicyLossSettings:
        """The clip settings in effect: ``clip_low``, ... with those ``loss_kind_args`` gives instead."""
        flat = {name: getattr(self, name) for name in ("clip_low", "clip_high", "dual_clip", "delta")}
        try:
            return loss_settings(self.loss_kind_args, **flat)
        except SettingError as error:  # a value from loss_kind_args: name it there
            if error.setting in (self.loss_kind_args or {}):
                raise error.renamed(f"loss_kind_args.{error.setting}") from None
            raise


@dataclass
class AdvantageConfig:
    """How rewards become advantages (docs/math.md), and which groups carry a signal (dynamic sampling)."""

    owner: ClassVar[str] = "GRPOConfig.advantages"
    rules: ClassVar[NumberRules] = {
        "advantage_eps": {"minimum": 0.0},
        "process_outcome_weight": {},
        "max_sampling_rounds": COUNT,
    }

    advantage_estimator: AdvantageEstimator | ImportPath = "grpo"
    """``"grpo"``, ``"rloo"``, ``"reinforce_pp_baseline"``, ``"grpo_process"`` (step rewards), ``"gdpo"`` (each
    reward function normalised on its own), ``"grpo_passk"``, ``"opo"``, ``"reinforce_plus_plus"``, ``"gpg"``, or
    your own's import path."""
    advantage_estimator_args: dict[str, Any] | None = None
    """Its own settings (``grpo_passk``: ``k``; ``reinforce_plus_plus``: ``gamma``; ``gpg``: ``f_norm``,
    ``alpha``; the other built-ins take none)."""
    advantage_scale: AdvantageScale = "group"
    """For ``grpo`` and ``grpo_process``: ``"group"`` std, ``"batch"`` std, or ``"none"`` (Dr. GRPO)."""
    advantage_eps: float = 1e-6
    """Added to the std before dividing (reward units)."""
    process_outcome_weight: float = 0.0
    """For ``grpo_process``: the outcome reward times this weight is the reward of one more reasoning step, ending
    at the completion's last token; 0: the step rewards alone (DeepSeekMath §4.1.3)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards are all equal and sample more prompts until the iteration
    holds ``batch_size`` informative groups per rank (docs/dynamic-sampling.md; verl ``filter_groups.enable``)."""
    max_sampling_rounds: int = 10
    """Most sampling rounds per iteration with ``dynamic_sampling`` (a count, the first included; verl
    ``max_num_gen_batches``); then the iteration trains on what it has, topped up with filtered groups."""

    def __post_init__(self) -> None:
        with check_group(self):
            check_components(self, ("advantage_estimator",))
            if estimator_needs(self.advantage_estimator).step_rewards and self.dynamic_sampling:
                raise ValueError(
                    "dynamic_sampling keeps groups whose outcome rewards differ, which says nothing of their step "
                    f"rewards: it cannot be combined with advantage_estimator={self.advantage_estimator!r}, which "
                    "reads step rewards; turn one of them off"
                )

    @property
    def kwargs(self) -> dict[str, Any]:
        """Settings of the advantage estimator (:func:`~lightning_grpo.algorithms.compute_advantages`)."""
        return {
            "estimator": self.advantage_estimator,
            "estimator_args": self.advantage_estimator_args,
            "scale": self.advantage_scale,
            "eps": self.advantage_eps,
        }


@dataclass
class CorrectionConfig:
    """Where the old log-probs come from and how the sampler/trainer mismatch is corrected (docs/math.md)."""

    owner: ClassVar[str] = "GRPOConfig.corrections"
    rules: ClassVar[NumberRules] = {}

    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    """``"recompute"``: the policy runs over the rollout again before the first update when it serves several
    (verl's default); with one update the old log-probs are the current ones, detached. ``"rollout"``: the behaviour
    log-probs the sampler recorded, for every update (verl's *bypass* mode): saves that forward; the ratio is
    ``π/μ`` from the first update on (``train/rollout_logprob_diff_max``)."""
    rollout_correction: RolloutCorrection | ImportPath | None = None
    """Importance weights for the sampler/trainer mismatch: ``"token_truncate"``, ``"token_mask"``,
    ``"sequence_truncate"``, ``"sequence_mask"`` (TRL ``vllm_importance_sampling_mode``, verl ``rollout_is``) or
    your own; ``None``: off. Needs a backend that records the behaviour log-probs."""
    rollout_correction_args: dict[str, Any] | None = None
    """Its settings: ``min`` (``None``) and ``max`` (3.0, TRL's) of the weights."""
    rollout_rejection: RolloutRejection | ImportPath | None = None
    """Drop the policy loss of sequences whose ``"token_mean"`` or ``"geometric"`` mean ratio is outside
    ``[min, max]`` (verl ``rollout_rs``); ``None``: off. Needs the behaviour log-probs."""
    rollout_rejection_args: dict[str, Any] | None = None
    """Its settings: ``min`` (0.5), ``max`` (2.0) and ``normalise``, the tokens the policy loss's normaliser counts:
    ``"all"`` (the default, rejected ones too) or ``"kept"`` (verl's)."""
    off_policy_mask: Literal["opsm"] | ImportPath | None = None
    """DeepSeek-V3.2's OPSM (TRL ``off_policy_mask_threshold``): negative-advantage sequences whose mean KL from the
    sampler exceeds ``threshold`` lose their policy loss; ``None``: off."""
    off_policy_mask_args: dict[str, Any] | None = None
    """Its settings; ``"opsm"``: ``threshold`` δ >= 0 (required)."""

    def __post_init__(self) -> None:
        with check_group(self):
            check_components(self, ("rollout_correction", "rollout_rejection", "off_policy_mask"))
            corrects = self.rollout_correction is not None or self.rollout_rejection is not None
            if corrects and self.old_logprobs == "rollout":
                raise SettingError(
                    f"rollout_correction={self.rollout_correction!r} / rollout_rejection={self.rollout_rejection!r} "
                    "with old_logprobs='rollout': the old log-probs are then the sampler's, so every ratio is 1 and "
                    "nothing is corrected; use old_logprobs='recompute' or turn the correction off",
                    "old_logprobs",
                    self.old_logprobs,
                )
