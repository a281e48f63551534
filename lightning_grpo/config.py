"""``GRPOConfig``: every algorithm setting of a GRPO run, typed, documented and checked in one place.

Names follow verl and TRL where they agree; ``docs/coming-from.md`` maps the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from jsonargparse.typing import restricted_string_type

from lightning_grpo import config_checks
from lightning_grpo.algorithms.advantages import AdvantageEstimator, AdvantageScale
from lightning_grpo.algorithms.aggregation import LossAggMode
from lightning_grpo.algorithms.catalogue import IMPORT_PATH_PATTERN
from lightning_grpo.algorithms.entropy import EntropyControlKind
from lightning_grpo.algorithms.kl import KLEstimator
from lightning_grpo.algorithms.policy_losses import PolicyLossKind, PolicyLossSettings, loss_settings
from lightning_grpo.algorithms.rollout_correction import RolloutCorrection, RolloutRejection
from lightning_grpo.rollout.buckets import DecodePath
from lightning_grpo.rollout.sampling_settings import Sampler, SamplingSettings
from lightning_grpo.settings_checks import SettingError

__all__ = ["GRPOConfig", "ImportPath"]

#: The import path of a user's function (``my_project.losses.my_loss``): for the command line's type checks, a name
#: that is neither a built-in nor dotted fails when the config is parsed. Stored as a plain ``str``.
ImportPath = restricted_string_type("ImportPath", IMPORT_PATH_PATTERN)


@dataclass
class GRPOConfig:
    """Settings of one GRPO iteration: sampling, updates, loss and advantages.

    Batch sizes count completions (sequences) per device: a step's rollout holds ``prompts_per_step * G`` of them,
    split into mini-batches (one optimizer step each) and micro-batches (one backward each).
    """

    num_generations: int = 8
    """Completions sampled per prompt (G); group estimators need G >= 2. 8 is a good default."""
    max_prompt_length: int = 512
    """Longest prompt in tokens; the data module drops longer ones."""
    max_new_tokens: int = 256
    """Longest completion in tokens; longer ones are cut and flagged as truncated."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1]; 1.0 disables it."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 disables it."""
    ppo_epochs: int = 1
    """Passes over each rollout (verl ``ppo_epochs``, TRL ``num_iterations``)."""
    mini_batch_size: int | None = None
    """Completions per optimizer step; ``None`` uses the whole rollout (one step per pass)."""
    micro_batch_size: int | None = None
    """Completions per forward/backward; ``None`` uses the whole mini-batch."""
    loss_kind: PolicyLossKind | ImportPath = "clip"
    """Policy loss: ``"clip"`` (PPO/GRPO clipped surrogate), ``"gspo"``, ``"cispo"``, ``"sapo"``, ``"gmpo"``,
    ``"dppo_tv"``, ``"dppo_kl"``, ``"clip_cov"``, ``"kl_cov"``, ``"gpg"`` (docs/math.md), or the import path of your
    own (``my_project.losses.my_loss``, docs/index.md)."""
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
    """``"k1"``, ``"k2"``, ``"k3"`` (= ``"low_var_kl"``), ``"abs"``, any with ``"+"``, or the import path of your
    own."""
    loss_agg_mode: LossAggMode = "token-mean"
    """``"token-mean"``, ``"token-sum"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
    ``"seq-mean-token-sum-norm"``."""
    loss_agg_norm: int | None = None
    """Divisor of ``seq-mean-token-sum-norm``; ``None`` uses ``max_new_tokens``."""
    advantage_estimator: AdvantageEstimator | ImportPath = "grpo"
    """``"grpo"``, ``"rloo"``, ``"reinforce_pp_baseline"``, ``"grpo_process"`` (process supervision: step rewards,
    ``docs/math.md``), ``"gdpo"`` (each reward function normalised on its own), ``"grpo_passk"``, ``"opo"``,
    ``"reinforce_plus_plus"``, ``"gpg"``, or the import path of your own."""
    advantage_scale: AdvantageScale = "group"
    """For ``grpo`` and ``grpo_process``: ``"group"`` std, ``"batch"`` std, or ``"none"`` (Dr. GRPO)."""
    advantage_eps: float = 1e-6
    """Added to the std before dividing."""
    process_outcome_weight: float = 0.0
    """For ``grpo_process``: the outcome reward (the weighted sum of the reward functions) times this weight is the
    reward of one more step, ending at the completion's last token; 0 (the default): the step rewards alone, as
    DeepSeekMath §4.1.3."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus (0 = none; the entropy is still logged, without gradient)."""
    mask_truncated_completions: bool = False
    """Leave completions that hit ``max_new_tokens`` out of the loss (DAPO)."""
    max_grad_norm: float | None = 1.0
    """Clip the adapter's gradient norm to this before each optimizer step; ``None`` disables it."""
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    """Where the old log-probs come from: ``"recompute"`` runs the policy over the rollout again before the first
    update when the rollout serves several (``ppo_epochs > 1`` or several mini-batches; verl's default,
    ``actor.recompute_log_prob``; exact: the first update's ratio is 1 to the last bit), and with one update the old
    log-probs are the current ones, detached; ``"rollout"`` takes the behaviour log-probs the sampler recorded, for
    every update, one or several (verl's rollout-correction *bypass* mode; TRL has no such switch): it saves that
    forward, and the ratio is ``π/μ`` from the first update on, exact up to the sampling/training kernel agreement
    logged as ``train/rollout_logprob_diff_max`` (``docs/benchmarks.md``)."""
    logprob_chunk_size: int = 1024
    """Positions per chunk of the log-softmax (memory versus kernel launches)."""
    share_prompt: bool = True
    """Run each prompt once for its G samples, in sampling (prefill) and in the log-prob passes (same results as
    running it G times; under FSDP2 the log-prob passes share it only on packed rows, with no KV cache)."""
    fused_head: bool = True
    """Compute log-probs inside the output head, tile by tile, so no ``(N, T, V)`` logits tensor exists."""
    fused_head_tile_mib: int | None = None
    """Float32 MiB of one tile of the fused head. ``None``: 512 on a GPU (a few large tiles: each costs about 30
    kernel launches), and on the CPU about an eighth of the final hidden states (docs/benchmarks.md, "GPU
    readiness")."""
    sampler: Sampler = "multinomial"
    """``"multinomial"`` (Hugging Face ``generate``'s draws) or ``"inverse_cdf"`` (same distribution, other draws,
    much cheaper on CPU; uses our own decoding loop)."""
    drop_finished: bool = False
    """Drop finished samples from the batch and KV cache while sampling (our own decoding loop)."""
    static_cache: bool = False
    """Sample with Hugging Face ``generate`` over a static KV cache, which transformers compiles itself on CUDA only;
    the prompt prefill is not shared and ``sampler``/``drop_finished`` are ignored. Not with ``decode: compiled``."""
    decode: DecodePath = "auto"
    """How the ``hf`` backend decodes: ``"eager"`` (``generate``, or our own loop as ``sampler``/``drop_finished``
    choose), ``"compiled"`` (one compiled step per decode step over a static KV cache per shape bucket, reused for the
    run: ``lightning_grpo.rollout.compiled_decode``; exact against the eager loop for a seed; not with
    ``drop_finished`` or ``static_cache``), or ``"auto"``: eager on CUDA until a GPU has measured the compiled path,
    on the CPU compiled only where it measured faster (``lightning_grpo.rollout.buckets.CPU_PREFERS_COMPILED``). A
    model transformers cannot compile with a static cache is an error with ``"compiled"``, eager with ``"auto"``. The
    agent turns of a multi-turn run keep the turn cache (``turn_cache``, on by default) and are sampled by the eager
    loop; ``turn_cache: false`` samples them compiled."""
    decode_lengths: list[int] | None = None
    """Static KV cache lengths (prompt + completion positions) of the compiled decode path, one compiled graph each;
    rows are rounded up to a power of two. ``None``: one, ``max_prompt_length + max_new_tokens`` rounded up to a
    multiple of 64; each must be at least ``max_prompt_length + max_new_tokens`` (longer ones serve later agent
    turns; a call longer than every bucket is sampled eagerly)."""
    sampling_adapter: Literal["as_trained", "base_dtype", "merged"] = "as_trained"
    """How the adapter samples (Hugging Face sampling only; vLLM has its own). ``"as_trained"``: the LoRA weights as
    trained (float32 by default; exact, the documented semantics). ``"base_dtype"``: a copy of them in the base
    model's dtype (e.g. bfloat16), so peft casts nothing (a decode step of a bf16 2-layer Qwen2: 319 ATen calls
    instead of 347). ``"merged"``: the adapter merged into the base weights while sampling (179 calls, the base
    model's own), which holds a copy of the adapted base weights meanwhile and refuses a quantized base. With either,
    the rollout comes from a policy rounded to the base dtype: ``train/rollout_logprob_diff_*`` measures it and
    ``rollout_correction`` corrects for it; training still scores the policy as trained. docs/benchmarks.md, "GPU
    readiness"."""
    rollout_backend: str = "hf"
    """What samples the rollouts: ``"hf"`` (Hugging Face ``generate``, or our own loop), ``"vllm"`` (a colocated vLLM
    engine; the module's ``vllm`` settings, ``docs/vllm.md``; TRL ``use_vllm`` with ``vllm_mode="colocate"``),
    ``"vllm_server"`` (a vLLM server on other GPUs or machines; TRL ``vllm_mode="server"``), or the import path of a
    user's ``RolloutBackend`` class (``"my_project.backends.MyBackend"``, ``docs/backends.md``)."""
    async_rollout: bool = False
    """Sample one step ahead: the next step's rollout is sampled in a background thread while this step updates the
    policy, with the adapter of the step before (one step off-policy, logged as ``rollout/staleness``; the first step
    samples synchronously). Needs a backend that samples apart from the trainer (``rollout_backend: vllm_server``);
    not with a ``generate`` override, ``dynamic_sampling``, tools, environments, agent code or FSDP2. Pair it with a
    ``rollout_correction`` (``token_truncate``) so the behaviour log-probs correct the staleness (docs/vllm.md, "One
    step ahead (async_rollout)"; TRL and verl: one-step off-policy)."""
    rollout_backend_args: dict[str, Any] | None = None
    """The backend's own settings: keyword arguments of its ``settings_class`` (for ``"vllm"``: ``VLLMConfig``'s
    fields; for ``"vllm_server"``: ``VLLMServerConfig``'s); an unknown key is an error naming the allowed ones. Saved
    in the checkpoint's hyper-parameters with the rest of this config; a resume with other values logs them and uses
    them (``docs/backends.md``)."""
    val_num_generations: int = 1
    """Samples per validation prompt (k of ``val/pass@k``)."""
    val_temperature: float | None = None
    """Validation sampling temperature; ``None`` uses ``temperature``."""
    val_success_threshold: float = 1.0
    """A validation sample counts as solved (``val/accuracy``, ``val/pass@k``) when its reward is at least this; 1.0
    suits 0/1 rewards."""
    fsdp_gather_for_generation: bool = True
    """Under FSDP2, all-gather the weights once per sampling call and keep them gathered while sampling (fast; needs
    memory for one full copy) instead of once per decoding step."""
    max_turns: int = 4
    """Most policy turns of a conversational trajectory with tools or an environment (``docs/agents.md``);
    ``max_new_tokens`` is the token budget of the whole trajectory. A trajectory cut by either is truncated."""
    tool_timeout: float = 10.0
    """Seconds a tool call may run; a call past it becomes an error message the model sees."""
    env_reward: Literal["sum", "last"] = "sum"
    """How per-turn environment rewards become the ``env_reward`` keyword of reward functions: ``"sum"`` or
    ``"last"``."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards are all equal (or all skipped) and sample more prompts of
    the training data until the step holds ``batch_size`` informative groups per rank (``docs/dynamic-sampling.md``;
    verl ``algorithm.filter_groups.enable``). Needs a :class:`~lightning_grpo.data.PromptDataModule` (or a data
    module with ``extra_batches``)."""
    max_sampling_rounds: int = 10
    """Most sampling rounds per step with ``dynamic_sampling`` (the first included; verl ``max_num_gen_batches``);
    when they run out the step trains on what it has, topped up with filtered groups to keep its size."""
    # faults (docs/troubleshooting.md): reward timeouts, non-finite steps
    reward_timeout: float | dict[str, float | None] | None = None
    """Seconds each reward function may take per step: one number for all, a mapping from reward name to seconds
    (``{"judge": 30}``; names as in ``train/reward/<name>``), or ``None`` for no limit. A function past it stops the
    run with an error naming it; its thread is abandoned and never keeps the process alive."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """What a non-finite loss, KL, ratio or gradient norm does: ``"stop"`` the run with an error naming the step and
    the quantity, or ``"skip"`` the step (no optimizer step, a warning), at most ``max_skipped_steps`` times. The
    adapter is never updated with, or saved with, a non-finite value."""
    max_skipped_steps: int = 3
    """Most steps ``on_nonfinite="skip"`` may skip in a run before it stops."""
    # components' own settings (docs/configuration.md, "Components and their settings")
    loss_kind_args: dict[str, Any] | None = None
    """The policy loss's own settings: keyword arguments of ``loss_kind``'s function (its keyword-only parameters) or
    class (its ``__init__``), e.g. ``{beta: 0.1}`` for ``my_project.losses.my_loss``. The built-ins take the clip
    settings they use (``clip``: ``clip_low``, ``clip_high``, ``dual_clip``, ``delta``; ``gspo``: ``clip_low``,
    ``clip_high``, ``delta``; ``cispo``: ``clip_low``, ``clip_high``; the others' settings are listed in
    docs/configuration.md); a loss's setting left out here takes the field of the same name above. An unknown key is
    an error naming the loss's settings."""
    kl_estimator_args: dict[str, Any] | None = None
    """The KL estimator's own settings: keyword arguments of ``kl_estimator``'s function or class (the built-ins take
    none)."""
    advantage_estimator_args: dict[str, Any] | None = None
    """The advantage estimator's own settings: keyword arguments of ``advantage_estimator``'s function or class
    (``grpo_passk``: ``k``; ``reinforce_plus_plus``: ``gamma``; ``gpg``: ``f_norm``, ``alpha``; the other built-ins
    take none)."""
    agent_call_timeout: float = 60.0
    """Seconds one chat call of ``GRPOModule(agent=...)`` may wait for its answer; then the agent's client raises
    ``openai.APITimeoutError`` (the call leaves no trace, so a retry neither forks nor duplicates the trajectory)."""
    agent_timeout: float = 600.0
    """Seconds one agent run (``agent(client, row)``) may take; a run past it is cancelled and skipped: no reward,
    counted in ``rollout/agent_failed`` (docs/agents.md, "Your own agent code")."""
    agent_batch_window: float = 0.01
    """Seconds the agents' calls are gathered before a batch is sampled when some agent is busy with its own work;
    a batch is sampled at once when every running agent waits on a call."""
    packing: bool | Literal["auto"] = "auto"
    """Run the log-prob passes and the update on packed rows: the sequences of a micro-batch concatenated without
    padding, positions restarting at each, attention kept inside each (docs/configuration.md, "Packing").
    ``"auto"`` packs a rollout whose completion positions are at least 20 % padding (decided once per rollout,
    ``rollout.packing.packing_for``: below that packing only adds its mask's cost) where the model's attention
    implementation takes packed rows (``sdpa``, ``eager``, ``flash_attention_2``/``3``), and pads elsewhere; ``True``
    always packs, raising where the implementation cannot; ``False`` always pads. With
    ``share_prompt`` (SDPA, eager) each distinct prompt is packed once, its completions attending to it through an
    explicit mask. Exact: per-token log-probs equal the padded ones within float rounding."""
    micro_batch_tokens: int | None = None
    """Token budget of a micro-batch (prompt and completion tokens, padding excluded; verl's
    ``ppo_max_token_len_per_gpu``): the rows of a mini-batch are split into the fewest balanced micro-batches within
    it, every rank running the same number. ``micro_batch_size``, if set too, caps the rows of each. ``None``:
    micro-batches by ``micro_batch_size`` alone."""
    turn_cache: bool | None = None
    """Keep each trajectory's KV cache from one agent turn to the next, so a turn prefills only the inserted
    tool/environment tokens (``docs/agents.md``, cost). ``None`` (auto, the default): on with a backend that keeps it
    (``hf``) for every multi-turn run (tools or an environment with ``max_turns > 1``, or ``agent=`` code), whatever
    the sampler (the default ``multinomial`` too: our own loop then draws as ``generate`` does, the same tokens for a
    seed), on one process and under DDP; off under FSDP2 and with ``static_cache`` (``generate`` samples those) and
    with other backends (``vllm``: its prefix cache). It wins over ``decode: compiled`` for the agent turns, which
    the eager loop then samples (logged once). ``True``: on, also for single-turn runs, an error where it cannot be
    kept (the ``vllm`` backend, FSDP2, ``static_cache``); ``False``: every turn re-prefills its whole context (and
    with ``decode: compiled`` is sampled compiled)."""
    # entropy control, rollout correction, off-policy masking (docs/math.md; lightning_grpo.algorithms.entropy, ...)
    entropy_control: EntropyControlKind | ImportPath = "constant"
    """What sets the entropy bonus's coefficient each step: ``"constant"`` (``entropy_coef``), ``"adaptive"``
    (Skywork-OR1: moved toward ``entropy_control_args.target``; TRL ``use_adaptive_entropy``; its coefficient is saved
    in checkpoints), or the import path of your own (``f(entropy) -> coefficient``)."""
    entropy_control_args: dict[str, Any] | None = None
    """The entropy control's own settings; ``"adaptive"``: ``target`` (0.2 nats), ``delta`` (0.005), ``coef_min``
    (0), ``coef_max`` (1), ``entropy_coef`` (the start; ``entropy_coef`` above unless given)."""
    token_selection: Literal["top_entropy"] | ImportPath | None = None
    """Which loss tokens keep their policy loss and entropy bonus: ``"top_entropy"`` ("Beyond the 80/20 Rule"; TRL
    ``top_entropy_quantile``), your own by import path, or ``None``: all."""
    token_selection_args: dict[str, Any] | None = None
    """Its settings; ``"top_entropy"``: ``quantile`` in (0, 1] (0.2, the paper's; per micro-batch)."""
    rollout_correction: RolloutCorrection | ImportPath | None = None
    """Importance weights for the sampler/trainer mismatch: ``"token_truncate"`` (truncated IS), ``"token_mask"``,
    ``"sequence_truncate"``, ``"sequence_mask"`` (TRL ``vllm_importance_sampling_mode``, verl ``rollout_is``) or your
    own; ``None``: off. Needs a backend that records the behaviour log-probs."""
    rollout_correction_args: dict[str, Any] | None = None
    """Its settings: ``min`` (``None``) and ``max`` (3.0, TRL's) of the weights."""
    rollout_rejection: RolloutRejection | ImportPath | None = None
    """Drop the policy loss of sequences whose ``"token_mean"`` or ``"geometric"`` mean importance ratio is outside
    ``[min, max]`` (verl ``rollout_rs``, bounds inverted); ``None``: off. Needs the behaviour log-probs."""
    rollout_rejection_args: dict[str, Any] | None = None
    """Its settings: ``min`` (0.5) and ``max`` (2.0)."""
    off_policy_mask: Literal["opsm"] | ImportPath | None = None
    """DeepSeek-V3.2's OPSM (``"opsm"``; TRL ``off_policy_mask_threshold``): negative-advantage sequences whose mean
    KL from the sampler exceeds ``threshold`` lose their policy loss; ``None``: off."""
    off_policy_mask_args: dict[str, Any] | None = None
    """Its settings; ``"opsm"``: ``threshold`` δ >= 0 (required)."""
    kl_weighting: Literal["importance"] | ImportPath | None = None
    """``"importance"``: multiply the per-token KL by ``π_θ/π_old`` (DeepSeek-V3.2's unbiased KL; TRL
    ``use_bias_correction_kl``, default there); ``None``: off."""
    kl_weighting_args: dict[str, Any] | None = None
    """Its settings: ``level``, ``"token"`` (the paper's) or ``"sequence"`` (TRL's GSPO, the sequence ratio)."""
    agent_transport: Literal["in_process", "http"] = "in_process"
    """How ``GRPOModule(agent=...)`` reaches the policy: ``"in_process"`` gives each run an in-process
    ``openai.AsyncOpenAI``; ``"http"`` serves ``/v1/chat/completions`` on 127.0.0.1 for the rollout, and each run gets
    an ``AsyncOpenAI`` on it with its trajectory's own key, for agent programs in other processes
    (``agent_env(client)``: ``OPENAI_BASE_URL``/``OPENAI_API_KEY``; docs/agents.md, "Agents over HTTP")."""
    agent_http_port: int = 0
    """Port of the ``agent_transport="http"`` server on 127.0.0.1; 0 picks a free port each rollout (each rank its
    own). A port in use is an error naming it; with several processes rank r listens on ``agent_http_port + r``."""
    collective_timeout_s: float | None = 900.0
    """Seconds any collective of a run of several processes may wait for the other ranks (1 to 604800, a week); then
    it raises (NCCL: its watchdog ends the process) instead of hanging. The ranks agree on a failed rollout before
    their next collective, so this bounds only the waits no agreement can prevent (a peer killed by the OS, a failure
    inside a sampling call under FSDP2). 900 s: longer than any wait a healthy run has (with agent code, one rank may
    wait ``agent_timeout``, 600 s, for another's agents: it must exceed that), half of torch's 30 min. ``None`` keeps
    the strategy's (``DDPStrategy(timeout=...)``, else 30 min); docs/distributed.md, "When a rank fails"."""

    def __post_init__(self) -> None:
        config_checks.check_config(self)  # every setting; an error names the field, the value, why and the fix

    def component(self, setting: str) -> Any:
        """The component chosen by ``setting`` (``"loss_kind"``, ...) with its settings (``<setting>_args``) bound.

        Raises:
            SettingError: The name is neither a built-in nor an importable import path (the built-ins listed), the
                settings hold a key the component does not take (its settings listed), or the object is not a
                component of its kind (the call it misses named).
        """
        return config_checks.component(self, setting)

    def policy_loss_settings(self) -> PolicyLossSettings:
        """The clip settings in effect: ``clip_low``, ... with those ``loss_kind_args`` gives instead."""
        flat = {name: getattr(self, name) for name in ("clip_low", "clip_high", "dual_clip", "delta")}
        try:
            return loss_settings(self.loss_kind_args, **flat)
        except SettingError as error:  # a value from loss_kind_args: name it there
            if error.setting in (self.loss_kind_args or {}):
                raise error.renamed(f"loss_kind_args.{error.setting}") from None
            raise

    def check_rollout_size(self, rollout_size: int) -> None:
        """Check the batch sizes against a rollout of ``rollout_size`` completions (prompts per step × G)."""
        config_checks.check_rollout_size(self, rollout_size)

    @property
    def sampling_kwargs(self) -> dict[str, Any]:
        """Settings shared by training and validation sampling."""
        names = ("max_new_tokens", "top_p", "top_k", "share_prompt", "sampler", "drop_finished", "static_cache")
        return {name: getattr(self, name) for name in names}

    def sampling_settings(
        self, num_generations: int | None = None, temperature: float | None = None, *, synced_gpus: bool = False
    ) -> SamplingSettings:
        """The sampling settings of training (``None`` arguments take this config's), or of validation."""
        return SamplingSettings(
            num_generations=num_generations or self.num_generations, temperature=temperature or self.temperature,
            synced_gpus=synced_gpus, **self.sampling_kwargs,
        )  # fmt: skip

    @property
    def advantage_kwargs(self) -> dict[str, Any]:
        """Settings of the advantage estimator (:func:`~lightning_grpo.algorithms.compute_advantages`)."""
        return {
            "estimator": self.advantage_estimator, "estimator_args": self.advantage_estimator_args,
            "scale": self.advantage_scale, "eps": self.advantage_eps,
        }  # fmt: skip

    @property
    def logprob_kwargs(self) -> dict[str, Any]:
        """Settings of the log-prob passes (:func:`~lightning_grpo.rollout.completion_logprobs`)."""
        return {
            "temperature": self.temperature, "chunk_size": self.logprob_chunk_size,
            "entropy_grad": self.entropy_coef > 0 or self.entropy_control != "constant",
            "share_prompt": self.share_prompt, "fused_head": self.fused_head, "packing": self.packing,
            "tile_bytes": None if self.fused_head_tile_mib is None else self.fused_head_tile_mib * 2**20,
        }  # fmt: skip
