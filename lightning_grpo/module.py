"""``GRPOModule``: one ``training_step`` is one GRPO iteration. Orchestration only; the math lives in ``algorithms``.

Each phase of the iteration (docs/index.md) is one overridable method: :meth:`GRPOModule.generate`,
:meth:`~GRPOModule.score`, :meth:`~GRPOModule.compute_advantages`, :meth:`~GRPOModule.prepare_update`,
:meth:`~GRPOModule.compute_logprobs`, :meth:`~GRPOModule.compute_loss`, :meth:`~GRPOModule.update_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
from lightning_grpo.backends import RolloutBackend, VLLMConfig
from lightning_grpo.backends.ahead import Batch, launch_ahead, take_ahead
from lightning_grpo.callbacks.defaults import module_callbacks
from lightning_grpo.callbacks.iteration_counter import upgrade_state_keys
from lightning_grpo.checkpoint import settings_of
from lightning_grpo.checkpoint.module_state import resume_module_state, save_module_state
from lightning_grpo.config import GRPOConfig
from lightning_grpo.data.lookahead import next_batch
from lightning_grpo.iteration import IterationContext, LossCounts, PhaseTimer, StepOutput, UpdateBatch, evaluation
from lightning_grpo.iteration.batch_loss import batch_loss
from lightning_grpo.iteration.dynamic_sampling import dynamic_sample
from lightning_grpo.iteration.fit_checks import check_fit_inputs, check_loader_batch_size
from lightning_grpo.iteration.function_rewards import function_reward_inputs
from lightning_grpo.iteration.module_parts import build_parts
from lightning_grpo.iteration.policy_logprobs import policy_logprobs
from lightning_grpo.iteration.process_supervision import advantage_inputs
from lightning_grpo.iteration.report import iteration_report
from lightning_grpo.iteration.rollout_advantages import rollout_advantages
from lightning_grpo.iteration.rollout_sampling import sample_with_backend, start_sampling
from lightning_grpo.iteration.scoring import score_rollout
from lightning_grpo.iteration.seeding import iteration_seed, seeded
from lightning_grpo.iteration.strategy_setup import set_up_strategy
from lightning_grpo.iteration.update import run_updates, update_batch
from lightning_grpo.iteration.zero_signal import check_signal
from lightning_grpo.policy import PolicyConfig, export_adapter
from lightning_grpo.policy.optimizer import LRSchedulerCallable, OptimizerCallable, adapter_optimizer
from lightning_grpo.rewards import RewardFunctions, RewardScores, TrainerState
from lightning_grpo.rollout import Rollout, TokenLogProbs, agent_client
from lightning_grpo.rollout.packing import packing_for
from lightning_grpo.rollout.rank_agreement import RankVotes
from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = ["GRPOModule", "StepOutput"]  # StepOutput is defined in lightning_grpo.iteration


class GRPOModule(LightningModule):
    """GRPO fine-tuning of a causal LM with a LoRA adapter; the reference policy is the adapter disabled.

    Args:
        model: A Hugging Face id or local path, a ``PreTrainedModel`` or a ``PeftModel``.
        reward_funcs: Reward functions ``fn(prompts, completions, **columns) -> list[float | None]``
            (docs/rewards.md); optional when agent code or a TRL-style environment gives the reward.
        reward_weights: One weight per reward function; ``None`` weighs each 1.0.
        tokenizer: Tokenizer or its id/path; defaults to the model's. One without a pad token gets EOS as pad.
        policy: Loading and LoRA settings (:class:`~lightning_grpo.policy.PolicyConfig`).
        grpo: Algorithm settings (:class:`~lightning_grpo.config.GRPOConfig`).
        optimizer: Builds the optimizer from the adapter parameters; default ``AdamW(lr=1e-5)``.
        lr_scheduler: Builds a scheduler from the optimizer; stepped once per ``training_step`` (one GRPO iteration).
        seed: Seeds sampling and mini-batch shuffling per iteration, so runs and resumed runs are reproducible.
        tools: Python functions and MCP servers the policy may call (docs/agents.md, "Tools").
        environment_factory: Environments, one per trajectory (docs/agents.md, "Environments").
        tool_parser: Reads tool calls from the policy's turns; defaults to ``<tool_call>{json}</tool_call>``.
        default_callbacks: Add the monitoring callbacks the trainer lacks (:meth:`configure_callbacks`).
        vllm: The colocated vLLM engine's settings (docs/vllm.md); ``None``: ``grpo.backend.rollout_backend_args``.
        agent: Your own agent code as the rollout (docs/agents.md, "Your own agent code").

    Training from Python, step by step: docs/index.md, "Train from Python".
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
        parts = build_parts(
            model,
            reward_funcs,
            reward_weights=reward_weights,
            tokenizer=tokenizer,
            policy=policy,
            grpo=grpo,
            seed=seed,
            tools=tools,
            environment_factory=environment_factory,
            tool_parser=tool_parser,
            vllm=vllm,
            agent=agent,
            generate_overridden=type(self).generate is not GRPOModule.generate,
        )
        self.config = parts.config
        self.policy_config = parts.policy_config
        self.agent_fn = parts.agent_fn
        self.rewards = parts.rewards
        self.tokenizer = parts.tokenizer
        self.policy = parts.policy
        self._trained_on = parts.trained_on  # checked on resume
        self.agent = parts.agent
        self.agent_limits = parts.agent_limits  # agent code's (agent=): time limits, transport
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.seed = seed
        self.use_default_callbacks = default_callbacks
        self.rollout_backend: RolloutBackend = parts.rollout_backend
        self.timer = PhaseTimer()
        self._warned: set[str] = set()  # the run's warnings given: shared by every iteration's context
        self._context: IterationContext | None = None  # the running training_step's context
        self._packing: bool | str | None = None  # the packing of this iteration's log-prob passes (packing_for)
        self.skipped_steps: list[int] = []  # optimizer steps skipped for non-finite values (faults.on_nonfinite)
        self.entropy_control = parts.entropy_control
        self.entropy_coef = self.entropy_control(None)  # this iteration's; updated from each iteration's global entropy
        self.val_metrics = parts.val_metrics
        self.test_metrics = evaluation.TestMetrics(self.val_metrics.k, self.val_metrics.threshold)  # test/*: own state
        self.save_hyperparameters(parts.hparams)  # plain values: checkpoints load with torch.load(weights_only=True)

    @property
    def max_prompt_length(self) -> int:
        """Longest prompt in tokens (read by :class:`~lightning_grpo.data.PromptDataModule`)."""
        return self.config.sampling.max_prompt_length

    def training_step(self, batch: Batch, batch_idx: int) -> StepOutput:
        """One GRPO iteration: sample, score, advantages, fixed log-probs, then ``ppo_epochs`` of updates."""
        self._context = context = self.iteration_context()  # once per iteration: update_policy reads it
        (timer := context.timer).reset()
        with seeded(context.seed, self.device):  # of (seed, global_step, rank) only: a resumed run samples the same
            with timer("sync"):  # the policy's weights reach the backend (docs/backends.md)
                self.rollout_backend.sync(self.policy, self.global_step)
            with timer("generate"):  # 1; with async_rollout, the rollout sampled during the last iteration's update
                step, backend = context.global_step, self.rollout_backend
                rollout = take_ahead(backend, batch, step=step, ranks=self._rank_votes(), log=context.log)
                rollout = self.generate(batch) if rollout is None else rollout  # none sampled ahead: sampled now
                launch_ahead(backend, partial(next_batch, self._trainer), len(rollout), self.sampling_settings, step)
            with timer("score"):
                scores = self.score(rollout)  # 2
            if self.config.advantages.dynamic_sampling:  # more prompts until groups carry signal (dynamic-sampling.md)
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
            if self.config.objective.entropy_control != "constant" and "entropy" in metrics:  # adaptive: one sync
                self.entropy_coef = float(self.entropy_control(float(metrics["entropy"])))  # global: alike on all ranks
        self._context = self._packing = None
        logged, output = iteration_report(loss, metrics, rollout, scores, advantages, update, self.config, timer)
        self.log_dict(logged)  # global values
        return output

    def generate(
        self, batch: Batch, *, num_generations: int | None = None, temperature: float | None = None
    ) -> Rollout:
        """Phase 1: G completions (trajectories) per prompt of ``batch["prompt"]``; other keys become row columns."""
        settings = self.sampling_settings(num_generations=num_generations, temperature=temperature)
        agents = (self.agent, self.agent_fn, self.agent_limits)
        where = (self.global_step, self.global_rank, self._rank_votes())  # the ranks agree on the rollout
        rollout, stats = sample_with_backend(
            self.rollout_backend, self.policy, self.tokenizer, batch, settings, agents, where, self.config
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
        state = TrainerState.of(self._trainer)  # the reward functions' trainer_state keyword
        return score_rollout(self.rewards, rollout, self.config, self.tokenizer, state, device=self.device)

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
        return rollout_advantages(
            rewards, rollout, self.config, self._sum_across_ranks, step_rewards, function_rewards, function_weights
        )

    def prepare_update(self, rollout: Rollout, advantages: Tensor) -> UpdateBatch:
        """Phase 4: the loss mask, old log-probs (only if the rollout serves several updates), reference log-probs."""
        if not agent_client.is_agent_rollout(rollout):  # an agent rollout has a variable number of rows
            self.config.check_rollout_size(len(rollout))
        self.rollout_backend.release()  # e.g. vllm.sleep_mode: the engine's memory goes to the update
        self._packing = packing_for(rollout, self.config.update.packing)  # once per rollout: every pass takes one path
        context = self._context or self.iteration_context()
        return update_batch(self.compute_logprobs, self.policy, rollout, advantages, self.config, context)

    def compute_logprobs(
        self, rollout: Rollout, *, reference: bool = False, with_entropy: bool = False
    ) -> TokenLogProbs:
        """Per-token log-probs ``(N, T)`` of the completions, of the reference if ``reference``; phase 4 uses it too."""
        settings = self.logprob_settings()
        return policy_logprobs(self.policy, rollout, settings, reference=reference, with_entropy=with_entropy)

    def logprob_settings(self) -> dict[str, Any]:
        """Keyword settings of :func:`~lightning_grpo.rollout.completion_logprobs`, from :attr:`config`."""
        kwargs = self.config.logprob_kwargs
        return kwargs if self._packing is None else {**kwargs, "packing": self._packing}

    def compute_loss(self, batch: UpdateBatch, counts: LossCounts) -> tuple[Tensor, dict[str, Tensor]]:
        """Phase 5 (per micro-batch): ``policy loss + β·KL − c_ent·entropy``, global counts (``grpo_loss``)."""
        current = self.compute_logprobs(batch.rollout, with_entropy=True)
        seed = self._iteration_seed()  # of the policy loss's random choices (clip_cov)
        return batch_loss(current, batch, counts, self.config, seed=seed, entropy_coef=self.entropy_coef)

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
        trainer = self._trainer
        return IterationContext(
            device=self.device,
            global_step=self.global_step,
            seed=self._iteration_seed(),
            sum_across_ranks=self._sum_across_ranks,
            log=self.log,
            timer=self.timer,
            warned=self._warned,
            skipped=self.skipped_steps,
            grad_scale=1.0 if trainer is None else distributed.grad_scale(trainer.strategy, trainer.world_size),
        )

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Any]:
        """Sample ``validation.num_generations`` per prompt, score, log ``val/*`` (test: ``test/*``); evaluation.md."""
        rollout = self._sample_for_evaluation(batch, batch_idx)
        scores = self.score(rollout)
        metrics = self.test_metrics if self._trainer is not None and self.trainer.testing else self.val_metrics
        self.log_dict(evaluation.update(metrics, scores, rollout, batch), batch_size=len(batch["prompt"]))  # exact
        return {"rollout": rollout, "rewards": scores}

    test_step = validation_step  # on test prompts: test/reward_mean, test/accuracy, test/pass@k

    def predict_step(self, batch: Batch, batch_idx: int) -> list[dict[str, Any]]:
        """Sample as validation does; per prompt its completions and (if scorable) rewards: docs/evaluation.md."""
        rollout = self._sample_for_evaluation(batch, batch_idx)
        scores = evaluation.prediction_scores(self.rewards, batch, rollout, self.score, self._warned)
        return evaluation.prediction_records(rollout, scores)

    def setup(self, stage: str) -> None:
        """Check the strategy against the run, bound collectives' waits, check checkpoint files; on CPU, set threads."""
        set_up_strategy(self.trainer, self.config, self.policy, agent_code=self.agent_fn)

    def configure_model(self) -> None:
        """Under FSDP2 (``ModelParallelStrategy``) only: shard each decoder layer, then the HF model under PeftModel."""
        strategy = self.trainer.strategy if self._trainer is not None else None
        if distributed.is_fsdp2(strategy) and not distributed.is_sharded(self.policy):
            mesh, gather = self.device_mesh["data_parallel"], self.config.sampling.fsdp_gather_for_generation
            distributed.shard_module(self, mesh, gather)

    @property
    def export_adapter_all_ranks(self) -> bool:
        """Whether every rank must call :meth:`export_adapter` (FSDP2: the adapter is gathered from all ranks)."""
        return distributed.is_sharded(self.policy)

    def configure_optimizers(self) -> Any:
        """AdamW (or the injected optimizer) over adapter parameters only, with the optional scheduler."""
        optimizer, scheduler = self._build_optimizer()
        self._optimizer_settings = settings_of(optimizer, scheduler)  # saved in checkpoints, compared on resume
        return optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler}}

    def configure_callbacks(self) -> list[Callback]:
        """The callbacks the module brings, those of types the trainer lacks (:func:`~lightning_grpo.callbacks.defaults.
        module_callbacks`): the monitoring set, the progress bar, the model summary line, the predictions' writer."""
        servers, monitoring = bool(self.agent.servers), self.use_default_callbacks
        return module_callbacks(self.trainer, tool_servers=servers, monitoring=monitoring)

    def on_fit_start(self) -> None:
        """Time phases, check the inputs, then ready the sampling: reward models, the rollout backend."""
        self.timer.device = self.device
        extra = agent_client.AGENT_COLUMNS if self.agent_fn is not None else ()  # an agent rollout's own columns
        environment = self.agent.has_environment
        check_fit_inputs(
            self.config, self.rewards, self.trainer.datamodule, environment=environment, rollout_columns=extra
        )
        start_sampling(self.rollout_backend, self.rewards, self.policy, device=self.device, seed=self.seed)

    def on_validation_start(self) -> None:
        """A validate, test or predict of its own readies the sampling as fit does and sends the backend the policy's
        weights (no training_step will); the validation inside a fit finds it ready (:meth:`on_fit_start`)."""
        if self.trainer.state.fn != "fit":  # CloseRolloutBackend closes the backend at the end of the run
            backend, step = self.rollout_backend, self.global_step
            start_sampling(backend, self.rewards, self.policy, device=self.device, seed=self.seed, version=step)

    on_test_start = on_predict_start = on_validation_start  # test and predict start as validate does

    def on_train_start(self) -> None:
        """Check the batch sizes against the data's before the first rollout is sampled."""
        check_loader_batch_size(self.config, self.trainer.train_dataloader)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the adapter weights in the checkpoint; record what it was trained on (docs/distributed.md)."""
        settings = getattr(self, "_optimizer_settings", None)  # set by configure_optimizers
        record = {"policy": self._trained_on, "optimizer": settings}
        save_module_state(checkpoint, self, record, self.entropy_control, self.entropy_coef)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another policy; changed settings take effect (docs/distributed.md, resuming)."""
        upgrade_state_keys(checkpoint)  # an older checkpoint's callback states under today's keys, before their restore
        self.entropy_coef = resume_module_state(
            checkpoint, self, self._trained_on, self._build_optimizer, self.entropy_control, self.entropy_coef
        )

    def export_adapter(self, path: str | Path) -> Path:
        """Write the adapter in PEFT format (``PeftModel.from_pretrained``, vLLM); under FSDP2 every rank calls it."""
        if self.export_adapter_all_ranks:
            return distributed.export_sharded_adapter(self.policy, path, is_global_zero=self.global_rank == 0)
        return export_adapter(self.policy, path)

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

    def _sample_for_evaluation(self, batch: Batch, batch_idx: int) -> Rollout:
        """``batch`` sampled at the validation settings, seeded by (seed, global_step, rank, batch_idx)."""
        seed = self._iteration_seed(offset=batch_idx + 1)
        return evaluation.sample(self.generate, batch, self.config.validation, seed=seed, device=self.device)

    def _iteration_seed(self, offset: int = 0) -> int:
        """The iteration's seed, of (seed, global_step, rank, offset): sampling that a resumed run repeats exactly."""
        return iteration_seed(self.seed, self.global_step, self.global_rank, offset)
