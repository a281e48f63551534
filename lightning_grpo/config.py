"""``GRPOConfig``: every algorithm setting of a GRPO run, typed, documented and checked in one place.

Names follow verl and TRL where they agree; ``docs/coming-from.md`` maps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from jsonargparse.typing import restricted_string_type

from lightning_grpo.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
from lightning_grpo.algorithms.advantages import AdvantageEstimator, AdvantageScale, estimator_needs
from lightning_grpo.algorithms.aggregation import LossAggMode
from lightning_grpo.algorithms.catalogue import IMPORT_PATH_PATTERN, choose, is_import_path
from lightning_grpo.algorithms.kl import KLEstimator
from lightning_grpo.algorithms.policy_losses import PolicyLossKind, check_clip_args
from lightning_grpo.rewards._validation import check_timeouts
from lightning_grpo.rollout.generation import SAMPLERS, Sampler
from lightning_grpo.settings_checks import SettingError, check_number, named_errors

__all__ = ["GRPOConfig", "ImportPath"]

#: The import path of a user's function (``my_project.losses.my_loss``): for the command line's type checks, a name
#: that is neither a built-in nor dotted fails when the config is parsed. Stored as a plain ``str``.
ImportPath = restricted_string_type("ImportPath", IMPORT_PATH_PATTERN)
#: Settings chosen from an open catalogue (a built-in name or an import path), with the catalogue and its noun.
_OPEN = {
    "loss_kind": (POLICY_LOSSES, "policy loss kind"),
    "kl_estimator": (KL_ESTIMATORS, "KL estimator"),
    "advantage_estimator": (ADVANTAGE_ESTIMATORS, "advantage estimator"),
}

_INT: dict[str, Any] = {"integer": True, "minimum": 1}  # a count or size: an int >= 1
_OPTIONAL_INT: dict[str, Any] = {**_INT, "allow_none": True}
#: Every numeric setting and its allowed range (``check_number``'s arguments); a new numeric field adds a line here.
_NUMBER_RULES: dict[str, dict[str, Any]] = {
    "num_generations": _INT,
    "max_prompt_length": _INT,
    "max_new_tokens": _INT,
    "temperature": {"minimum": 0.0, "exclusive_minimum": True},
    "top_p": {"minimum": 0.0, "maximum": 1.0, "exclusive_minimum": True},
    "top_k": {"integer": True, "minimum": 0},
    "ppo_epochs": _INT,
    "mini_batch_size": _OPTIONAL_INT,
    "micro_batch_size": _OPTIONAL_INT,
    "kl_coef": {"minimum": 0.0},
    "loss_agg_norm": _OPTIONAL_INT,
    "advantage_eps": {"minimum": 0.0},
    "process_outcome_weight": {},
    "entropy_coef": {"minimum": 0.0},
    "max_grad_norm": {"minimum": 0.0, "exclusive_minimum": True, "allow_none": True},
    "logprob_chunk_size": _INT,
    "fused_head_tile_mib": _OPTIONAL_INT,
    "val_num_generations": _INT,
    "val_temperature": {"minimum": 0.0, "exclusive_minimum": True, "allow_none": True},
    "val_success_threshold": {},
    "max_sampling_rounds": _INT,
    "max_skipped_steps": {"integer": True, "minimum": 0},
    "tis_cap": {"minimum": 1.0, "allow_none": True},
}


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
        loss_kind: Policy loss: ``"clip"`` (PPO/GRPO clipped surrogate), ``"gspo"``, ``"cispo"``, or the import path
            of your own (``my_project.losses.my_loss``, docs/index.md).
        clip_low: Ratio clipped below at ``1 - clip_low`` (verl ``clip_ratio_low``, TRL ``epsilon``).
        clip_high: Ratio clipped above at ``1 + clip_high``; larger than ``clip_low`` is DAPO's clip-higher.
        dual_clip: Dual-clip bound ``c`` for negative advantages (verl ``clip_ratio_c``); ``None`` disables it.
        delta: INTELLECT-2 upper bound on the ratio; ``None`` disables it.
        kl_coef: Weight β of the KL loss to the reference policy; 0 skips the reference forward entirely.
        kl_estimator: ``"k1"``, ``"k2"``, ``"k3"`` (= ``"low_var_kl"``), ``"abs"``, any with ``"+"``, or the
            import path of your own.
        loss_agg_mode: ``"token-mean"``, ``"token-sum"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
            ``"seq-mean-token-sum-norm"``.
        loss_agg_norm: Divisor of ``seq-mean-token-sum-norm``; ``None`` uses ``max_new_tokens``.
        advantage_estimator: ``"grpo"``, ``"rloo"``, ``"reinforce_pp_baseline"``, ``"grpo_process"`` (process
            supervision: step rewards, ``docs/math.md``), or the import path of your own.
        advantage_scale: For ``grpo`` and ``grpo_process``: ``"group"`` std, ``"batch"`` std, or ``"none"``
            (Dr. GRPO).
        advantage_eps: Added to the std before dividing.
        process_outcome_weight: For ``grpo_process``: the outcome reward (the weighted sum of the reward functions)
            times this weight is the reward of one more step, ending at the completion's last token; 0 (the
            default): the step rewards alone, as DeepSeekMath §4.1.3.
        entropy_coef: Weight of an entropy bonus (0 = none; the entropy is still logged, without gradient).
        mask_truncated_completions: Leave completions that hit ``max_new_tokens`` out of the loss (DAPO).
        max_grad_norm: Clip the adapter's gradient norm to this before each optimizer step; ``None`` disables it.
        old_logprobs: Where the old log-probs of a rollout that serves several updates (``ppo_epochs > 1`` or
            several mini-batches) come from: ``"recompute"`` runs the policy over the rollout again before the first
            update (verl's default, ``actor.recompute_log_prob``; exact: the first update's ratio is 1 to the last
            bit); ``"rollout"`` takes the behaviour log-probs the sampler recorded (verl's rollout-correction
            *bypass* mode; TRL has no such switch), which saves that forward and is exact up to the
            sampling/training kernel agreement logged as ``train/rollout_logprob_diff_max`` (``docs/benchmarks.md``).
        logprob_chunk_size: Positions per chunk of the log-softmax (memory versus kernel launches).
        share_prompt: Run each prompt once for its G samples, in sampling (prefill) and in the log-prob passes
            (same results as running it G times; off under FSDP2 in the log-prob passes).
        fused_head: Compute log-probs inside the output head, tile by tile, so no ``(N, T, V)`` logits tensor exists.
        fused_head_tile_mib: Float32 MiB of one tile of the fused head. ``None``: 512 on a GPU (a few large tiles:
            each costs about 30 kernel launches), and on the CPU about an eighth of the final hidden states
            (docs/benchmarks.md, "GPU readiness").
        sampler: ``"multinomial"`` (Hugging Face ``generate``'s draws) or ``"inverse_cdf"`` (same distribution, other
            draws, much cheaper on CPU; uses our own decoding loop).
        drop_finished: Drop finished samples from the batch and KV cache while sampling (our own decoding loop).
        static_cache: Sample with a static KV cache and a compiled decode step (CUDA only).
        sampling_adapter: How the adapter samples (Hugging Face sampling only; vLLM has its own). ``"as_trained"``:
            the LoRA weights as trained (float32 by default; exact, the documented semantics). ``"base_dtype"``: a
            copy of them in the base model's dtype (e.g. bfloat16), so peft casts nothing (a decode step of a bf16
            2-layer Qwen2: 319 ATen calls instead of 347). ``"merged"``: the adapter merged into the base weights
            while sampling (179 calls, the base model's own), which holds a copy of the adapted base weights
            meanwhile and refuses a quantized base. With either, the rollout comes from a policy rounded to the base
            dtype: ``train/rollout_logprob_diff_*`` measures it and ``tis_cap`` corrects for it; training still
            scores the policy as trained. docs/benchmarks.md, "GPU readiness".
        rollout_backend: What samples the rollouts: ``"hf"`` (Hugging Face ``generate``, or our own loop),
            ``"vllm"`` (a colocated vLLM engine; the module's ``vllm`` settings, ``docs/vllm.md``; TRL ``use_vllm``
            with ``vllm_mode="colocate"``), or the import path of a user's ``RolloutBackend`` class
            (``"my_project.backends.MyBackend"``, ``docs/backends.md``).
        rollout_backend_args: The backend's own settings: keyword arguments of its ``settings_class`` (for
            ``"vllm"``: ``VLLMConfig``'s fields); an unknown key is an error naming the allowed ones. Saved in the
            checkpoint's hyper-parameters with the rest of this config; a resume with other values logs them and
            uses them (``docs/backends.md``).
        tis_cap: Truncated importance sampling (TIS) for a sampler whose log-probs differ from the trainer's: each
            token's policy loss is weighted by ``min(exp(old_logprobs - rollout logprobs), tis_cap)``, no gradient
            through the weight (verl's rollout correction, TRL ``vllm_importance_sampling_cap``); ``None``: off.
            Needs the behaviour log-probs the sampler records (``docs/vllm.md``).
        val_num_generations: Samples per validation prompt (k of ``val/pass@k``).
        val_temperature: Validation sampling temperature; ``None`` uses ``temperature``.
        val_success_threshold: A validation sample counts as solved (``val/accuracy``, ``val/pass@k``) when its
            reward is at least this; 1.0 suits 0/1 rewards.
        fsdp_gather_for_generation: Under FSDP2, all-gather the weights once per sampling call and keep them
            gathered while sampling (fast; needs memory for one full copy) instead of once per decoding step.
        max_turns: Most policy turns of a conversational trajectory with tools or an environment (``docs/agents.md``);
            ``max_new_tokens`` is the token budget of the whole trajectory. A trajectory cut by either is truncated.
        tool_timeout: Seconds a tool call may run; a call past it becomes an error message the model sees.
        env_reward: How per-turn environment rewards become the ``env_reward`` keyword of reward functions:
            ``"sum"`` or ``"last"``.
        dynamic_sampling: DAPO's dynamic sampling: drop groups whose rewards are all equal (or all skipped) and
            sample more prompts of the training data until the step holds ``batch_size`` informative groups per rank
            (``docs/dynamic-sampling.md``; verl ``algorithm.filter_groups.enable``). Needs a
            :class:`~lightning_grpo.data.PromptDataModule` (or a data module with ``extra_batches``).
        max_sampling_rounds: Most sampling rounds per step with ``dynamic_sampling`` (the first included; verl
            ``max_num_gen_batches``); when they run out the step trains on what it has, topped up with filtered
            groups to keep its size.
        reward_timeout: Seconds each reward function may take per step: one number for all, a mapping from reward
            name to seconds (``{"judge": 30}``; names as in ``train/reward/<name>``), or ``None`` for no limit. A
            function past it stops the run with an error naming it; its thread is abandoned and never keeps the
            process alive.
        on_nonfinite: What a non-finite loss, KL, ratio or gradient norm does: ``"stop"`` the run with an error
            naming the step and the quantity, or ``"skip"`` the step (no optimizer step, a warning), at most
            ``max_skipped_steps`` times. The adapter is never updated with, or saved with, a non-finite value.
        max_skipped_steps: Most steps ``on_nonfinite="skip"`` may skip in a run before it stops.
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
    loss_kind: PolicyLossKind | ImportPath = "clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    delta: float | None = None
    kl_coef: float = 0.001
    kl_estimator: KLEstimator | ImportPath = "k3"
    loss_agg_mode: LossAggMode = "token-mean"
    loss_agg_norm: int | None = None
    advantage_estimator: AdvantageEstimator | ImportPath = "grpo"
    advantage_scale: AdvantageScale = "group"
    advantage_eps: float = 1e-6
    process_outcome_weight: float = 0.0
    entropy_coef: float = 0.0
    mask_truncated_completions: bool = False
    max_grad_norm: float | None = 1.0
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    logprob_chunk_size: int = 1024
    share_prompt: bool = True
    fused_head: bool = True
    fused_head_tile_mib: int | None = None
    sampler: Sampler = "multinomial"
    drop_finished: bool = False
    static_cache: bool = False
    sampling_adapter: Literal["as_trained", "base_dtype", "merged"] = "as_trained"
    rollout_backend: str = "hf"
    rollout_backend_args: dict[str, Any] | None = None
    tis_cap: float | None = None
    val_num_generations: int = 1
    val_temperature: float | None = None
    val_success_threshold: float = 1.0
    fsdp_gather_for_generation: bool = True
    max_turns: int = 4
    tool_timeout: float = 10.0
    env_reward: Literal["sum", "last"] = "sum"
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 10
    # faults (docs/troubleshooting.md): reward timeouts, non-finite steps
    reward_timeout: float | dict[str, float | None] | None = None
    on_nonfinite: Literal["stop", "skip"] = "stop"
    max_skipped_steps: int = 3
    turn_cache: bool | None = None
    """Keep each trajectory's KV cache from one agent turn to the next, so a turn prefills only the inserted
    tool/environment tokens (``docs/agents.md``, cost). ``None`` (auto): on with a backend that keeps it (``hf``)
    when ``max_turns > 1`` and sampling already runs our own decoding loop (``sampler: inverse_cdf`` or
    ``drop_finished``, on one process); ``True``: on, also for the default ``multinomial`` sampler (our loop draws as
    ``generate`` does), an error where it cannot be kept (the ``vllm`` backend, FSDP2, ``static_cache``); ``False``:
    every turn re-prefills its whole context."""

    def __post_init__(self) -> None:
        with named_errors(self):  # "GRPOConfig.num_generations=1: ...": the field, the value, why and the fix
            self._check_names()
            self._check_ranges()
            self._check_batches()
            self._check_agent()
            self._check_faults()

    def _check_faults(self) -> None:
        timeout = self.reward_timeout
        check_timeouts(timeout, tuple(timeout) if isinstance(timeout, dict) else ("every reward",))
        if self.on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite={self.on_nonfinite!r} is not valid; choose one of 'stop', 'skip'")

    def _check_names(self) -> None:
        for setting, (catalogue, what) in _OPEN.items():  # a built-in name, or an import path that imports
            value = getattr(self, setting)
            try:
                choose(catalogue, value, what, import_paths=True)
            except ValueError as error:
                if is_import_path(value):  # the module or the function cannot be imported: say why
                    raise ValueError(f"{setting}={value!r} is not valid: {error}") from None
                options = ", ".join(repr(v) for v in catalogue)
                raise ValueError(
                    f"{setting}={value!r} is not valid; choose one of {options}, or the import path of a function of "
                    "the same signature such as 'my_project.module.function'"
                ) from None
            setattr(self, setting, str(value))  # a plain string in hyperparameters and checkpoints
        self._check_backend()
        for setting, valid in (
            ("loss_agg_mode", LOSS_AGG_MODES),
            ("advantage_scale", ("group", "batch", "none")),
            ("sampler", SAMPLERS),
            ("old_logprobs", ("recompute", "rollout")),
            ("sampling_adapter", ("as_trained", "base_dtype", "merged")),
        ):
            if getattr(self, setting) not in valid:
                options = ", ".join(repr(v) for v in valid)
                raise ValueError(f"{setting}={getattr(self, setting)!r} is not valid; choose one of {options}")

    def _check_backend(self) -> None:
        """The backend's name reads as one (it is imported when the module is built: ``lightning_grpo.backends``)."""
        backend, args = self.rollout_backend, self.rollout_backend_args
        if backend not in ("hf", "vllm") and not is_import_path(backend):
            raise ValueError(
                f"rollout_backend={backend!r} is not valid; choose one of 'hf', 'vllm', or the import path of a "
                "RolloutBackend class such as 'my_project.backends.MyBackend'"
            )
        if args is not None and not (isinstance(args, dict) and all(isinstance(key, str) for key in args)):
            raise TypeError(f"rollout_backend_args must be a mapping of setting names to values, got {args!r}")
        self.rollout_backend_args = None if args is None else dict(args)

    def _check_ranges(self) -> None:
        for setting, bounds in _NUMBER_RULES.items():
            check_number(setting, getattr(self, setting), **bounds)
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(field.default, bool) and not isinstance(value, bool):
                raise TypeError(f"{field.name} must be true or false, got {value!r} ({type(value).__name__})")
        needs = estimator_needs(self.advantage_estimator)  # what the estimator declares (declare_needs)
        if needs.groups and self.num_generations < 2:
            raise SettingError(
                f"num_generations={self.num_generations}: the group estimator {self.advantage_estimator!r} needs "
                "num_generations >= 2 (a group of one has no baseline); set num_generations to 2 or more (8 is usual)",
                "num_generations",
                self.num_generations,
            )
        if needs.step_rewards and self.dynamic_sampling:
            raise ValueError(
                "dynamic_sampling keeps groups whose outcome rewards differ, which says nothing of their step rewards: "
                f"it cannot be combined with advantage_estimator={self.advantage_estimator!r}, which reads step "
                "rewards; turn one of them off"
            )
        check_clip_args(self.clip_low, self.clip_high, self.dual_clip, self.delta)  # the loss checks the same

    def _check_agent(self) -> None:
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {self.max_turns!r}")
        if not isinstance(self.tool_timeout, int | float) or not 0 < self.tool_timeout < float("inf"):
            raise ValueError(f"tool_timeout must be a finite number of seconds > 0, got {self.tool_timeout!r}")
        if self.env_reward not in ("sum", "last"):
            raise ValueError(f"env_reward={self.env_reward!r} is not valid; choose one of 'sum', 'last'")

    def _check_batches(self) -> None:
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
