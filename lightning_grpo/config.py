"""``GRPOConfig``: every algorithm setting of a GRPO run, typed, documented and checked in one place.

Names follow verl and TRL where they agree; ``docs/coming-from.md`` maps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lightning_grpo.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
from lightning_grpo.algorithms.advantages import AdvantageEstimator, AdvantageScale
from lightning_grpo.algorithms.aggregation import LossAggMode
from lightning_grpo.algorithms.kl import KLEstimator
from lightning_grpo.algorithms.policy_losses import PolicyLossKind

__all__ = ["GRPOConfig"]

_GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_pp_baseline")


@dataclass
class GRPOConfig:
    """Settings of one GRPO iteration: sampling, updates, loss and advantages.

    Batch sizes count completions (sequences) per device: a step's rollout holds ``prompts_per_step * G`` of them,
    split into mini-batches (one optimizer step each) and micro-batches (one backward each).

    Attributes:
        num_generations: Completions sampled per prompt (G); group estimators need G >= 2. 8 is a good default.
        max_prompt_length: Longest prompt in tokens; the data module drops longer ones.
        max_new_tokens: Longest completion in tokens; longer ones are cut and flagged as truncated.
        temperature: Sampling temperature; log-probs are computed at the same temperature.
        top_p: Nucleus sampling threshold in (0, 1]; 1.0 disables it.
        top_k: Sample among the k most likely tokens; 0 disables it.
        ppo_epochs: Passes over each rollout (verl ``ppo_epochs``, TRL ``num_iterations``).
        mini_batch_size: Completions per optimizer step; ``None`` uses the whole rollout (one step per pass).
        micro_batch_size: Completions per forward/backward; ``None`` uses the whole mini-batch.
        loss_kind: Policy loss: ``"clip"`` (PPO/GRPO clipped surrogate), ``"gspo"`` or ``"cispo"``.
        clip_low: Ratio clipped below at ``1 - clip_low`` (verl ``clip_ratio_low``, TRL ``epsilon``).
        clip_high: Ratio clipped above at ``1 + clip_high``; larger than ``clip_low`` is DAPO's clip-higher.
        dual_clip: Dual-clip bound ``c`` for negative advantages (verl ``clip_ratio_c``); ``None`` disables it.
        delta: INTELLECT-2 upper bound on the ratio; ``None`` disables it.
        kl_coef: Weight β of the KL loss to the reference policy; 0 skips the reference forward entirely.
        kl_estimator: ``"k1"``, ``"k2"``, ``"k3"`` (= ``"low_var_kl"``), ``"abs"``, or any with ``"+"``.
        loss_agg_mode: ``"token-mean"``, ``"token-sum"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
            ``"seq-mean-token-sum-norm"``.
        loss_agg_norm: Divisor of ``seq-mean-token-sum-norm``; ``None`` uses ``max_new_tokens``.
        advantage_estimator: ``"grpo"``, ``"rloo"`` or ``"reinforce_pp_baseline"``.
        advantage_scale: For ``grpo``: ``"group"`` std, ``"batch"`` std, or ``"none"`` (Dr. GRPO).
        advantage_eps: Added to the std before dividing.
        entropy_coef: Weight of an entropy bonus (0 = none; the entropy is still logged, without gradient).
        mask_truncated_completions: Leave completions that hit ``max_new_tokens`` out of the loss (DAPO).
        max_grad_norm: Clip the adapter's gradient norm to this before each optimizer step; ``None`` disables it.
        logprob_chunk_size: Positions per chunk of the log-softmax (memory versus kernel launches).
        share_prompt: Run each prompt once for its G samples, in sampling (prefill) and in the log-prob passes
            (same results as running it G times; off under FSDP2 in the log-prob passes).
        fused_head: Compute log-probs inside the output head, tile by tile, so no ``(N, T, V)`` logits tensor exists.
        sampler: ``"multinomial"`` (Hugging Face ``generate``'s draws) or ``"inverse_cdf"`` (same distribution, other
            draws, much cheaper on CPU; uses our own decoding loop).
        drop_finished: Drop finished samples from the batch and KV cache while sampling (our own decoding loop).
        static_cache: Sample with a static KV cache and a compiled decode step (CUDA only).
        val_num_generations: Samples per validation prompt (k of ``val/pass@k``).
        val_temperature: Validation sampling temperature; ``None`` uses ``temperature``.
        val_success_threshold: A validation sample counts as solved (``val/accuracy``, ``val/pass@k``) when its
            reward is at least this; 1.0 suits 0/1 rewards.
        fsdp_gather_for_generation: Under FSDP2, all-gather the weights once per sampling call and keep them
            gathered while sampling (fast; needs memory for one full copy) instead of once per decoding step.
    """

    num_generations: int = 8
    max_prompt_length: int = 512
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int | None = None
    loss_kind: PolicyLossKind = "clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    delta: float | None = None
    kl_coef: float = 0.001
    kl_estimator: KLEstimator = "k3"
    loss_agg_mode: LossAggMode = "token-mean"
    loss_agg_norm: int | None = None
    advantage_estimator: AdvantageEstimator = "grpo"
    advantage_scale: AdvantageScale = "group"
    advantage_eps: float = 1e-6
    entropy_coef: float = 0.0
    mask_truncated_completions: bool = False
    max_grad_norm: float | None = 1.0
    logprob_chunk_size: int = 1024
    share_prompt: bool = True
    fused_head: bool = True
    sampler: Literal["multinomial", "inverse_cdf"] = "multinomial"
    drop_finished: bool = False
    static_cache: bool = False
    val_num_generations: int = 1
    val_temperature: float | None = None
    val_success_threshold: float = 1.0
    fsdp_gather_for_generation: bool = True

    def __post_init__(self) -> None:
        self._check_names()
        self._check_ranges()
        self._check_batches()

    def _check_names(self) -> None:
        for setting, valid in (
            ("loss_kind", POLICY_LOSSES),
            ("kl_estimator", KL_ESTIMATORS),
            ("loss_agg_mode", LOSS_AGG_MODES),
            ("advantage_estimator", ADVANTAGE_ESTIMATORS),
            ("advantage_scale", ("group", "batch", "none")),
            ("sampler", ("multinomial", "inverse_cdf")),
        ):
            if getattr(self, setting) not in valid:
                options = ", ".join(repr(v) for v in valid)
                raise ValueError(f"{setting}={getattr(self, setting)!r} is not valid; choose one of {options}")

    def _check_ranges(self) -> None:
        positive = ("max_prompt_length", "max_new_tokens", "ppo_epochs", "logprob_chunk_size", "val_num_generations")
        for setting in positive:
            if getattr(self, setting) < 1:
                raise ValueError(f"{setting} must be >= 1, got {getattr(self, setting)}")
        if self.advantage_estimator in _GROUP_ESTIMATORS and self.num_generations < 2:
            raise ValueError(
                f"num_generations={self.num_generations}: the group estimator {self.advantage_estimator!r} needs "
                "num_generations >= 2 (a group of one has no baseline)"
            )
        if self.temperature <= 0 or (self.val_temperature is not None and self.val_temperature <= 0):
            raise ValueError(
                f"temperature and val_temperature must be > 0; got {self.temperature}, {self.val_temperature}"
            )
        if not 0.0 < self.top_p <= 1.0 or self.top_k < 0:
            raise ValueError(f"top_p must be in (0, 1] and top_k >= 0; got top_p={self.top_p}, top_k={self.top_k}")
        if not 0.0 <= self.clip_low < 1.0 or self.clip_high < 0.0:
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0; got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 or None, got {self.dual_clip}")
        if self.delta is not None and self.delta <= 1.0 + self.clip_high:
            raise ValueError(f"delta must be > 1 + clip_high = {1 + self.clip_high} or None, got {self.delta}")
        if self.kl_coef < 0 or self.entropy_coef < 0 or self.advantage_eps < 0:
            raise ValueError("kl_coef, entropy_coef and advantage_eps must be >= 0")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.loss_agg_norm is not None and self.loss_agg_norm < 1:
            raise ValueError(f"loss_agg_norm must be >= 1 or None, got {self.loss_agg_norm}")

    def _check_batches(self) -> None:
        for setting in ("mini_batch_size", "micro_batch_size"):
            value = getattr(self, setting)
            if value is not None and value < 1:
                raise ValueError(f"{setting} must be >= 1 or None, got {value}")
        mini, micro = self.mini_batch_size, self.micro_batch_size
        if mini is not None and micro is not None and mini % micro:
            raise ValueError(f"mini_batch_size={mini} must be a multiple of micro_batch_size={micro}")

    def check_rollout_size(self, rollout_size: int) -> None:
        """Check the batch sizes against a rollout of ``rollout_size`` completions (prompts per step × G)."""
        mini = self.mini_batch_size or rollout_size
        micro = self.micro_batch_size or mini
        if rollout_size % mini or mini % micro:
            raise ValueError(
                f"the rollout has {rollout_size} completions (prompts per step × G={self.num_generations}); "
                f"it must be a multiple of mini_batch_size={mini}, itself a multiple of micro_batch_size={micro}"
            )

    @property
    def sampling_kwargs(self) -> dict[str, Any]:
        """Settings shared by training and validation sampling."""
        names = ("max_new_tokens", "top_p", "top_k", "share_prompt", "sampler", "drop_finished", "static_cache")
        return {name: getattr(self, name) for name in names}
