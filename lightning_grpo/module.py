"""``GRPOModule``: one ``training_step`` is one GRPO iteration. Orchestration only; the math lives in ``algorithms``.

Each phase of the iteration (docs/index.md) is one overridable method: :meth:`GRPOModule.generate`,
:meth:`~GRPOModule.score`, :meth:`~GRPOModule.compute_advantages`, :meth:`~GRPOModule.prepare_update`,
:meth:`~GRPOModule.compute_logprobs`, :meth:`~GRPOModule.compute_loss`, :meth:`~GRPOModule.update_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import closing, nullcontext
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule
from peft import PeftModel
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_grpo import distributed
from lightning_grpo.agents import EnvironmentFactory, ToolCallParser
from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.algorithms.entropy import controller_state, entropy_controller, restore_controller
from lightning_grpo.algorithms.objective import grpo_loss
from lightning_grpo.backends import BackendSpec, RolloutBackend, VLLMConfig, build_backend
from lightning_grpo.backends.ahead import ahead_of, launch_ahead, take_ahead
from lightning_grpo.callbacks.defaults import module_callbacks
from lightning_grpo.callbacks.iteration_counter import upgrade_state_keys
from lightning_grpo.checkpoint import check_resume, describe_policy, install_checked_io, keep_adapter_only, settings_of
from lightning_grpo.config import GRPOConfig
from lightning_grpo.data.lookahead import next_batch
from lightning_grpo.iteration import IterationContext, LossCounts, PhaseTimer, StepOutput, UpdateBatch
from lightning_grpo.iteration.cpu_threads import apply_default_cpu_threads
from lightning_grpo.iteration.dynamic_sampling import dynamic_sample
from lightning_grpo.iteration.fit_checks import check_fit_inputs, check_loader_batch_size
from lightning_grpo.iteration.function_rewards import check_function_rewards, function_reward_inputs
from lightning_grpo.iteration.nonfinite import nonfinite_sampling
from lightning_grpo.iteration.process_supervision import advantage_inputs, gather_step_rewards
from lightning_grpo.iteration.seeding import iteration_seed, seeded
from lightning_grpo.iteration.update import run_updates, update_batch
from lightning_grpo.iteration.zero_signal import check_signal
from lightning_grpo.metrics import ValidationMetrics
from lightning_grpo.policy import PolicyConfig, export_adapter, load_policy, load_tokenizer, reference_mode
from lightning_grpo.policy.optimizer import LRSchedulerCallable, OptimizerCallable, adapter_optimizer
from lightning_grpo.policy.quantization import check_shardable
from lightning_grpo.rewards import RewardFunctions, RewardScores, TrainerState
from lightning_grpo.rollout import Rollout, TokenLogProbs, agent_client, agent_wiring, completion_logprobs
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.packing import packing_for, sharded_logprob_settings
from lightning_grpo.rollout.rank_agreement import RankVotes
from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = ["GRPOModule", "StepOutput"]  # StepOutput is defined in lightning_grpo.iteration


class GRPOModule(LightningModule):
    """GRPO fine-tuning of a causal LM with a LoRA adapter; the reference policy is the adapter disabled.

    Args:
        model: A Hugging Face id or local path, a ``PreTrainedModel`` or a ``PeftModel``.
        reward_funcs: Reward functions ``fn(prompts, completions, **columns) -> list[float | None]`` (a sequence, a
            mapping, or a ``RewardFunctions``); optional when a TRL-style environment has ``get_reward()``.
        reward_weights: One weight per reward function; ``None`` weighs each 1.0.
        tokenizer: Tokenizer or its id/path; defaults to the model's. One without a pad token gets EOS as pad.
        policy: Loading and LoRA settings (:class:`~lightning_grpo.policy.PolicyConfig`).
        grpo: Algorithm settings (:class:`~lightning_grpo.config.GRPOConfig`).
        optimizer: Builds the optimizer from the adapter parameters; default ``AdamW(lr=1e-5)``.
        lr_scheduler: Builds a scheduler from the optimizer; stepped once per ``training_step`` (one GRPO iteration).
        seed: Seeds sampling and mini-batch shuffling per iteration, so runs and resumed runs are reproducible.
        tools: Typed, documented Python functions and MCP servers the policy may call; chat prompts (docs/agents.md).
        environment_factory: ``factory(row)`` of environments with ``step``, or TRL-style ones, a dict, or import paths.
        tool_parser: Reads tool calls from the policy's turns; defaults to the ``<tool_call>{json}</tool_call>`` form.
        default_callbacks: Add the monitoring callbacks of :func:`~lightning_grpo.callbacks.default_callbacks` that
            the trainer lacks (:meth:`configure_callbacks`), so any ``Trainer`` logs ``train/reward_mean`` and the
            rest; ``False``: only the trainer's callbacks.
        vllm: Settings of the colocated vLLM engine of ``grpo.backend.rollout_backend="vllm"`` (``docs/vllm.md``);
            ``None``: ``grpo.backend.rollout_backend_args`` or the defaults. Any backend's settings:
            ``grpo.backend.rollout_backend_args``.
        agent: Your own agent code as the rollout: ``async def agent(client, row) -> float | None`` (or its import
            path), run G times per row with an ``openai.AsyncOpenAI`` on the policy, in process or over a loopback
            HTTP server (``GRPOConfig.agents.agent_transport``; docs/agents.md, "Your own agent code", "Agents over
            HTTP"); without ``reward_funcs`` the reward is what it returns.

    Example::

        from lightning import Trainer
        from lightning_grpo import GRPOModule, GRPOConfig, PromptDataModule
        from lightning_grpo.config import SamplingConfig
        from lightning_grpo.rewards import math_answer

        grpo = GRPOConfig(sampling=SamplingConfig(num_generations=8))
        module = GRPOModule("Qwen/Qwen2.5-0.5B-Instruct", [math_answer], grpo=grpo)
        Trainer(max_steps=100).fit(module, PromptDataModule("train.jsonl", batch_size=4))
    """

    #: FLOPs per ``training_step``, read by Lightning's ``ThroughputMonitor`` for MFU; ``None``: not measured.
    flops_per_batch: int | None = None

    def __init__(
        self,
        model: str | PreTrainedModel | PeftModel,
        reward_funcs: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]] | RewardFunctions | None = None,
        *,
        reward_weights: Sequence[float] | None = None,
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        policy: PolicyConfig | None = None,
        grpo: GRPOConfig | None = None,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        seed: int = 0,
        tools: Sequence[dict[str, Any] | Callable[..., Any]] | None = None,
        environment_factory: str | Mapping[str, str | Callable[[], Any]] | EnvironmentFactory | None = None,
        tool_parser: ToolCallParser | None = None,
        default_callbacks: bool = True,
        vllm: VLLMConfig | None = None,
        agent: Callable[..., Any] | str | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the adapter only, not the base weights
        self.config = cfg = grpo or GRPOConfig()
        self.policy_config = policy or PolicyConfig()
        self.agent_fn = agent_wiring.agent_code(
            agent, tools, environment_factory, dynamic_sampling=cfg.advantages.dynamic_sampling
        )
        factory, self.rewards = agent_wiring.agent_rewards(
            self.agent_fn, environment_factory, reward_funcs, reward_weights, timeout=cfg.faults.reward_timeout
        )
        check_function_rewards(cfg, self.rewards, agent=self.agent_fn is not None)  # gdpo: two functions or more
        name = model if isinstance(model, str | Path) else None
        self.tokenizer = load_tokenizer(tokenizer, name, trust_remote_code=self.policy_config.trust_remote_code)
        self.policy = load_policy(model, self.policy_config, seed=seed).train()
        self._trained_on = describe_policy(self.policy, self.tokenizer, model)  # checked on resume
        self.agent = AgentSettings.build(
            self.tokenizer,
            tools=tools,
            tool_parser=tool_parser,
            environment_factory=factory,
            max_turns=cfg.agents.max_turns,
            tool_timeout=cfg.agents.tool_timeout,
            env_reward=cfg.agents.env_reward,
        )
        self.agent_limits = agent_client.AgentLimits.of(cfg)  # agent code's (agent=): time limits, transport
        self.optimizer_factory, self.scheduler_factory, self.seed = optimizer, lr_scheduler, seed
        self.use_default_callbacks = default_callbacks
        spec = BackendSpec(
            cfg,
            self.policy_config,
            None if name is None else str(name),
            generate_overridden=type(self).generate is not GRPOModule.generate,
            multi_turn=(self.agent.multi_turn and cfg.agents.max_turns > 1) or bool(self.agent_fn),
        )
        backend = build_backend(spec, vllm)  # always one; with async_rollout, one that also samples ahead
        self.rollout_backend: RolloutBackend = ahead_of(backend, cfg, self.tokenizer, self.agent, self.agent_limits)
        self.timer, self._warned = (
            PhaseTimer(),
            set[str](),
        )  # the run's warnings given: shared by every iteration's context
        self._context: IterationContext | None = None  # the running training_step's context
        self._packing: bool | str | None = None  # the packing of this iteration's log-prob passes (packing_for)
        self.skipped_steps: list[
            int
        ] = []  # steps skipped for non-finite values (GRPOConfig.faults.on_nonfinite="skip")
        self.entropy_control = entropy_controller(
            cfg.objective.entropy_control, cfg.objective.entropy_control_args, cfg.objective.entropy_coef, shared=False
        )
        self.entropy_coef = self.entropy_control(None)  # this iteration's; updated from each iteration's global entropy
        self.val_metrics = ValidationMetrics(
            self.config.validation.num_generations, self.config.validation.success_threshold
        )
        hparams = {"model": str(name), "grpo": asdict(self.config), "policy": asdict(self.policy_config), "seed": seed}
        self.save_hyperparameters(hparams)  # plain values only: checkpoints load with torch.load(weights_only=True)

    @property
    def max_prompt_length(self) -> int:
        """Longest prompt in tokens (read by :class:`~lightning_grpo.data.PromptDataModule`)."""
        return self.config.sampling.max_prompt_length

    # ---------------------------------------------------------------- the GRPO iteration

    def training_step(self, batch: Mapping[str, Sequence[Any]], batch_idx: int) -> StepOutput:
        """One GRPO iteration: sample, score, advantages, fixed log-probs, then ``ppo_epochs`` of updates."""
        self._context = context = self.iteration_context()  # once per iteration: update_policy reads it
        (timer := context.timer).reset()
        with seeded(
            context.seed, self.device
        ):  # depends only on (seed, global_step, rank): a resumed run samples the same
            with timer("sync"):  # the policy's weights reach the backend (docs/backends.md)
                self.rollout_backend.sync(self.policy, self.global_step)
            with timer("generate"):  # 1; with async_rollout, the rollout sampled during the last iteration's update
                step, backend = context.global_step, self.rollout_backend
                rollout = take_ahead(backend, batch, step=step, ranks=self._rank_votes(), log=context.log)
                rollout = self.generate(batch) if rollout is None else rollout  # none sampled ahead: sampled now
                launch_ahead(backend, partial(next_batch, self._trainer), len(rollout), self.sampling_settings, step)
            with timer("score"):
                scores = self.score(rollout)  # 2
            if (
                self.config.advantages.dynamic_sampling
            ):  # more prompts until groups carry signal (docs/dynamic-sampling.md)
                rollout, scores = dynamic_sample(
                    context,
                    rollout,
                    scores,
                    generate=self.generate,
                    score=self.score,
                    source=self.trainer.datamodule,
                    max_rounds=self.config.advantages.max_sampling_rounds,
                    pad_token_id=self.tokenizer.pad_token_id or 0,
                )
            check_signal(context, rollout, scores)  # logs train/zero_std_frac; warns once on a zero-signal iteration
            with timer("score"):
                inputs = {**advantage_inputs(scores), **function_reward_inputs(self.config, scores, self.rewards)}
                advantages = self.compute_advantages(scores.rewards, rollout, **inputs)  # 3
            update = self.prepare_update(rollout, advantages)  # 4 (timed inside: old_logprobs, reference)
            with timer("update"):
                loss, metrics = self.update_policy(update)  # 5
            if (
                self.config.objective.entropy_control != "constant" and "entropy" in metrics
            ):  # one host sync, adaptive only
                self.entropy_coef = float(self.entropy_control(float(metrics["entropy"])))  # global: alike on all ranks
        self._context = self._packing = None
        self.log_dict({f"train/{name}": value for name, value in {"loss": loss, **metrics}.items()})  # global values
        return StepOutput(
            loss=loss,
            rollout=rollout,
            rewards=scores,
            advantages=advantages,
            metrics=metrics,
            loss_mask=update.loss_mask,
            ppo_epochs=self.config.update.ppo_epochs,
            timings={**timer.seconds, **{f"score/{name}": s for name, s in scores.seconds.items()}},  # per reward
        )

    def generate(
        self,
        batch: Mapping[str, Sequence[Any]],
        *,
        num_generations: int | None = None,
        temperature: float | None = None,
    ) -> Rollout:
        """Phase 1: G completions (trajectories) per prompt of ``batch["prompt"]``; other keys become row columns."""
        settings = self.sampling_settings(num_generations=num_generations, temperature=temperature)
        backend, rank = self.rollout_backend, self.global_rank if self._trainer is not None else 0
        backend.sync(self.policy, self.global_step if self._trainer is not None else 0)  # no-op once synced
        with nonfinite_sampling(self.global_step), closing(backend.session(self.policy, settings)) as session:
            rollout, stats = agent_wiring.sample_batch(
                self.policy,
                self.tokenizer,
                batch,
                settings,
                self.agent,
                self.agent_fn,
                session=session,
                max_prompt_length=self.config.sampling.max_prompt_length,
                limits=self.agent_limits,
                rank=rank,
                ranks=self._rank_votes(),  # agreed before the ranks' next collective (docs/distributed.md)
            )
        if stats is not None and self._trainer is not None and self._context is not None:  # agent code's executions
            self.log_dict(stats.metrics(len(rollout)), batch_size=stats.executions)
        return rollout

    def sampling_settings(
        self, *, num_generations: int | None = None, temperature: float | None = None
    ) -> SamplingSettings:
        """The sampling settings of :meth:`generate`, from :attr:`config` (``None`` arguments take its values)."""
        fsdp2 = self._trainer is not None and distributed.is_fsdp2(self.trainer.strategy)  # all ranks step together
        return self.config.sampling.settings(num_generations, temperature, synced_gpus=fsdp2)

    def score(self, rollout: Rollout) -> RewardScores:
        """Phase 2: every reward function, weighted; ``NaN`` where every function returned ``None``."""
        scores = self.rewards(
            rollout.prompts,
            rollout.completions,
            rollout.columns,
            completion_ids=rollout.completion_token_ids,
            completion_lengths=rollout.completion_lengths.tolist(),
            trainer_state=TrainerState.of(self._trainer),
        )
        per_function = {k: v.to(self.device) for k, v in scores.per_function.items()}
        steps = gather_step_rewards(self.config, self.tokenizer, rollout, scores, self.rewards)  # grpo_process only
        return RewardScores(scores.rewards.to(self.device), per_function, scores.seconds, scores.steps, steps)

    def compute_advantages(
        self,
        rewards: Tensor,
        rollout: Rollout,
        step_rewards: Tensor | None = None,
        function_rewards: Mapping[str, Tensor] | None = None,
        function_weights: Mapping[str, float] | None = None,
    ) -> Tensor:
        """Phase 3: group-relative advantages ``(N,)`` (``(N, T)`` for token-level estimators and ``grpo_process``).

        ``function_rewards`` and ``function_weights`` (each reward function's raw rewards and weight) are given only
        to an estimator that reads them (``gdpo``)."""
        agents = agent_client.is_agent_rollout(rollout)  # one reward per trajectory (its last branch), shared
        rewards = agent_client.trajectory_rewards_nan(rewards, rollout) if agents else rewards
        advantages = compute_advantages(
            rewards,
            rollout.group_ids,
            **self.config.advantages.kwargs,
            completion_mask=rollout.sampled_mask,
            sum_across_ranks=self._sum_across_ranks,
            step_rewards=step_rewards,
            function_rewards=function_rewards,
            function_weights=function_weights,  # token-level estimators whiten over rollout.sampled_mask
        )
        return agent_client.spread_to_branches(advantages, rollout) if agents else advantages

    def prepare_update(self, rollout: Rollout, advantages: Tensor) -> UpdateBatch:
        """Phase 4: the loss mask, old log-probs (only if the rollout serves several updates), reference log-probs."""
        if not agent_client.is_agent_rollout(rollout):  # an agent rollout has a variable number of rows
            self.config.check_rollout_size(len(rollout))
        self.rollout_backend.release()  # e.g. vllm.sleep_mode: the engine's memory goes to the update
        self._packing = packing_for(rollout, self.config.update.packing)  # once per rollout: every pass takes one path
        return update_batch(
            self.compute_logprobs,
            self.policy,
            rollout,
            advantages,
            self.config,
            self.timer,
            self.device,
            self._sum_across_ranks,
        )

    def compute_logprobs(
        self, rollout: Rollout, *, reference: bool = False, with_entropy: bool = False
    ) -> TokenLogProbs:
        """Per-token log-probs ``(N, T)`` of the completions, of the reference if ``reference``; phase 4 uses it too."""
        settings = self.logprob_settings()
        if distributed.is_sharded(self.policy):  # every pass (old, reference, current) takes the same path
            settings = sharded_logprob_settings(self.policy, settings)
        with reference_mode(self.policy) if reference else nullcontext():
            return completion_logprobs(self.policy, rollout, with_entropy=with_entropy, **settings)

    def logprob_settings(self) -> dict[str, Any]:
        """Keyword settings of :func:`~lightning_grpo.rollout.completion_logprobs`, from :attr:`config`."""
        kwargs = self.config.logprob_kwargs
        return kwargs if self._packing is None else {**kwargs, "packing": self._packing}

    def compute_loss(self, batch: UpdateBatch, counts: LossCounts) -> tuple[Tensor, dict[str, Tensor]]:
        """Phase 5 (per micro-batch): ``policy loss + β·KL − c_ent·entropy``, global counts (``grpo_loss``)."""
        current = self.compute_logprobs(batch.rollout, with_entropy=True)
        aggregate = partial(
            counts.aggregate, loss_mask=batch.loss_mask, mode=self.config.objective.loss_agg_mode
        )  # global
        return grpo_loss(
            current.logprobs,
            current.entropy,
            batch.advantages,
            batch.loss_mask,
            self.config.objective,
            aggregate,
            corrections=self.config.corrections,
            old_logprobs=batch.old_logprobs,
            ref_logprobs=batch.ref_logprobs,
            behaviour_logprobs=batch.rollout.logprobs,
            at_sampling_weights=batch.at_sampling_weights,
            seed=self._iteration_seed(),
            entropy_coef=self.entropy_coef,
        )

    def update_policy(self, batch: UpdateBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """``ppo_epochs`` passes over shuffled mini-batches, one optimizer step each (``run_updates``)."""
        return run_updates(
            batch,
            self._context or self.iteration_context(),
            self.config,
            policy=self.policy,
            compute_loss=self.compute_loss,
            backward=self.manual_backward,
            optimizer=self.optimizers(),
            clip_gradients=self.clip_gradients,
            scheduler=self.lr_schedulers(),
        )

    def iteration_context(self) -> IterationContext:
        """What this iteration's phases take from the module (:class:`~lightning_grpo.iteration.IterationContext`)."""
        return IterationContext(
            device=self.device,
            global_step=self.global_step if self._trainer is not None else 0,
            seed=self._iteration_seed(),
            sum_across_ranks=self._sum_across_ranks,
            log=self.log,
            timer=self.timer,
            warned=self._warned,
            skipped=self.skipped_steps,
            grad_scale=1.0
            if self._trainer is None
            else distributed.grad_scale(self.trainer.strategy, self.trainer.world_size),
        )

    # ---------------------------------------------------------------- validation

    def validation_step(self, batch: Mapping[str, Sequence[Any]], batch_idx: int) -> dict[str, Any]:
        """Sample ``val_num_generations`` per prompt; log reward mean, accuracy, pass@k; return rollout and rewards."""
        cfg = self.config
        with seeded(self._iteration_seed(offset=batch_idx + 1), self.device):
            rollout = self.generate(
                batch, num_generations=cfg.validation.num_generations, temperature=cfg.validation.temperature
            )
        scores = self.score(rollout)
        rewards = agent_wiring.trajectory_rewards(
            scores.rewards, rollout, trajectories=len(batch["prompt"]) * cfg.validation.num_generations
        )
        self.log_dict(self.val_metrics.update(rewards), batch_size=len(batch["prompt"]))  # exact, all ranks
        return {"rollout": rollout, "rewards": scores}

    # ---------------------------------------------------------------- distributed set-up

    def setup(self, stage: str) -> None:
        """Refuse strategies GRPO cannot run, bound collectives' waits (``distributed.set_up``); on CPU, set threads."""
        distributed.set_up(self.trainer.strategy, self.config, agents=self.agent_fn is not None)
        agent_wiring.check_agent_strategy(self.agent_fn, fsdp2=distributed.is_fsdp2(self.trainer.strategy))
        if distributed.is_fsdp2(self.trainer.strategy):
            check_shardable(self.policy)  # a bitsandbytes base cannot be sharded: use DDP (docs/quantization.md)
        install_checked_io(self.trainer.strategy)  # an unreadable checkpoint file gets an error naming it
        apply_default_cpu_threads(self.trainer.strategy.root_device, self.policy, processes=self.trainer.num_devices)

    def configure_model(self) -> None:
        """Under FSDP2 (``ModelParallelStrategy``) only: shard each decoder layer, then the HF model under PeftModel."""
        strategy = self.trainer.strategy if self._trainer is not None else None
        if distributed.is_fsdp2(strategy) and not distributed.is_sharded(self.policy):
            distributed.shard_module(
                self, self.device_mesh["data_parallel"], self.config.sampling.fsdp_gather_for_generation
            )

    @property
    def export_adapter_all_ranks(self) -> bool:
        """Whether every rank must call :meth:`export_adapter` (FSDP2: the adapter is gathered from all ranks)."""
        return distributed.is_sharded(self.policy)

    # ---------------------------------------------------------------- optimizers, checkpoints, export

    def configure_optimizers(self) -> Any:
        """AdamW (or the injected optimizer) over adapter parameters only, with the optional scheduler."""
        optimizer, scheduler = self._build_optimizer()
        self._optimizer_settings = settings_of(optimizer, scheduler)  # saved in checkpoints, compared on resume
        return optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler}}

    def configure_callbacks(self) -> list[Callback]:
        """The monitoring callbacks (:func:`~lightning_grpo.callbacks.default_callbacks`) of types the trainer lacks.

        A trainer's callback of the same or a related type wins; Lightning's default bar becomes ``GRPOProgressBar``.
        """
        servers, monitoring = bool(self.agent.servers), self.use_default_callbacks
        return module_callbacks(self.trainer, tool_servers=servers, monitoring=monitoring)

    def on_fit_start(self) -> None:
        """Time phases, score with reward models on the module's device, check the inputs, start the backend."""
        self.timer.device = self.device
        self.rewards.to(self.device, getattr(self.policy, "dtype", None))  # reward models are not in the policy
        extra = agent_client.AGENT_COLUMNS if self.agent_fn is not None else ()  # an agent rollout's own columns
        check_fit_inputs(
            self.config,
            self.rewards,
            self.trainer.datamodule,
            environment=self.agent.has_environment,
            rollout_columns=extra,
        )
        self.rollout_backend.start(self.policy, self.seed, sharded=distributed.is_sharded(self.policy))

    def on_train_start(self) -> None:
        """Check the batch sizes against the data's before the first rollout is sampled."""
        check_loader_batch_size(self.config, self.trainer.train_dataloader)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the adapter weights in the checkpoint; record what it was trained on (docs/distributed.md)."""
        settings = getattr(self, "_optimizer_settings", None)  # set by configure_optimizers
        keep_adapter_only(checkpoint, self, {"policy": self._trained_on, "optimizer": settings})
        checkpoint["entropy_control"] = controller_state(self.entropy_control, self.entropy_coef)  # docs/math.md

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another policy; changed settings take effect (docs/distributed.md, resuming)."""
        defaults = {"grpo": asdict(GRPOConfig())}  # settings an older checkpoint lacks compare as their defaults
        upgrade_state_keys(checkpoint)  # an older checkpoint's callback states under today's keys, before their restore
        check_resume(self, checkpoint, self._trained_on, self._build_optimizer, defaults)
        coef = restore_controller(self.entropy_control, checkpoint.get("entropy_control"))
        self.entropy_coef = self.entropy_coef if coef is None else coef

    def export_adapter(self, path: str | Path) -> Path:
        """Write the adapter in PEFT format (``PeftModel.from_pretrained``, vLLM); under FSDP2 every rank calls it."""
        if self.export_adapter_all_ranks:
            return distributed.export_sharded_adapter(self.policy, path, is_global_zero=self.global_rank == 0)
        return export_adapter(self.policy, path)

    # ---------------------------------------------------------------- helpers

    def _build_optimizer(self) -> tuple[torch.optim.Optimizer, Any]:
        """A new optimizer over the adapter's parameters and its scheduler (``None`` without ``lr_scheduler``)."""
        return adapter_optimizer(self.policy, self.optimizer_factory, self.scheduler_factory)

    def _sum_across_ranks(self, tensor: Tensor) -> Tensor:
        """Sum over ranks (one all-reduce, mid-iteration) of what enters the loss and advantages; not logged metrics."""
        if self._trainer is None or self.trainer.world_size == 1:
            return tensor
        return self.trainer.strategy.reduce(tensor, reduce_op="sum")

    def _rank_votes(self) -> RankVotes | None:
        """What the ranks agree on each rollout with (``rollout.rank_agreement``); ``None`` on one process."""
        world_size = self.trainer.world_size if self._trainer is not None else 1
        return RankVotes.of(self._sum_across_ranks, self.device, self.global_rank, world_size)

    def _iteration_seed(self, offset: int = 0) -> int:
        """The iteration's seed, of (seed, global_step, rank, offset): sampling that a resumed run repeats exactly."""
        global_step, rank = (self.global_step, self.global_rank) if self._trainer is not None else (0, 0)
        return iteration_seed(self.seed, global_step, rank, offset)
