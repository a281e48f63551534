"""TRL's side: ``trl.GRPOTrainer`` on the identical workload (same files, LoRA, lengths, β, one update per rollout).

Settings chosen to match ours (TRL 1.16 ``GRPOConfig`` names): ``num_generations=G``,
``per_device_train_batch_size`` = our micro-batch, ``gradient_accumulation_steps = rows / micro`` (and so
``steps_per_generation``, its default), hence ``generation_batch_size = B*G`` and one optimizer step per rollout per
``num_iterations`` (= our ``ppo_epochs``); ``max_completion_length=T`` with ``generation_kwargs={"min_new_tokens": T}``;
``beta`` = our ``kl_coef``; ``loss_type="dapo"`` (= our "token-mean" with a global token count), ``epsilon=0.2``;
``use_bias_correction_kl=False`` (our KL term is not weighted by the ratio); ``scale_rewards="group"``;
``gradient_checkpointing`` and ``bf16`` as in the workload (TRL defaults both to on); HF ``generate``, no vLLM.

Per-phase times come from TRL's own profiling hooks (``ProfilingContext``), captured by patching their sink; the step
time from a ``TrainerCallback`` (``on_step_begin`` to ``on_step_end``, which encloses generation, scoring, every
micro-batch and the optimizer step).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback

from benchmarks.models import load_tokenizer
from benchmarks.uneven import ScriptedEOS
from benchmarks.workload import Workload, fraction_of_sevens, make_prompts

__all__ = ["run_trl"]


class _Profiles:
    """Collects TRL's profiling blocks as ``(name, wall seconds, CPU seconds, enclosing names)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, float, tuple[str, ...]]] = []
        self.stack: list[tuple[str, float]] = []

    def install(self) -> None:
        """Patch ``ProfilingContext`` so that every block reports here (TRL only logs to W&B/MLflow/Trackio)."""
        from trl.extras.profiling import ProfilingContext

        profiles = self
        enter, exit_ = ProfilingContext.__enter__, ProfilingContext.__exit__

        def patched_enter(context: Any) -> Any:
            profiles.stack.append((context.name.split(".", 1)[-1], time.process_time()))
            return enter(context)

        def patched_exit(context: Any, *exc: Any) -> bool:
            wall = time.perf_counter() - context._start_time
            name, cpu_start = profiles.stack.pop()
            outer = tuple(n for n, _ in profiles.stack)
            profiles.events.append((name, wall, time.process_time() - cpu_start, outer))
            return exit_(context, *exc)

        ProfilingContext.__enter__, ProfilingContext.__exit__ = patched_enter, patched_exit

    def take(self) -> list[tuple[str, float, float, tuple[str, ...]]]:
        """The events since the last call."""
        events, self.events = self.events, []
        return events


class _LengthRecorder:
    """The synthetic reward, recording each rollout's completion lengths (TRL's ``completion_ids``, EOS included)."""

    def __init__(self) -> None:
        self.rollouts: list[list[int]] = []
        self.__name__ = fraction_of_sevens.__name__  # TRL names the reward's metrics after it

    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None, **kw: Any) -> list:
        if completion_ids is not None:
            self.rollouts.append([len(ids) for ids in completion_ids])
        return fraction_of_sevens(prompts, completions, **kw)


def _phases(events: list[tuple[str, float, float, tuple[str, ...]]], work: Workload, step: float, cpu: bool) -> dict:
    """Map TRL's profiled blocks onto our phases (wall or CPU seconds); ``update`` is the step minus
    ``_prepare_inputs`` (generation, scoring and the fixed log-probs)."""
    pick = 2 if cpu else 1
    total = lambda name: sum(e[pick] for e in events if e[0] == name)  # noqa: E731
    fixed = [e[pick] for e in events if e[0] == "_get_per_token_logps_and_entropies" and "_prepare_inputs" in e[3]]
    old = fixed.pop(0) if work.ppo_epochs > 1 and fixed else 0.0
    return {
        "generate": total("transformers.generate"),
        "score": total("_calculate_rewards"),
        "old_logprobs": old,
        "reference": sum(fixed),
        "update": step - total("_prepare_inputs"),
    }


class _StepClock(TrainerCallback):
    """One record per rollout: wall and CPU time of its ``num_iterations`` optimizer steps, phases and tokens."""

    def __init__(self, work: Workload, profiles: _Profiles, device: str, lengths: _LengthRecorder) -> None:
        self.work, self.profiles, self.device, self.lengths = work, profiles, device, lengths
        self.steps: list[dict[str, Any]] = []
        self._start, self._seconds, self._cpu_start, self._cpu_seconds = 0.0, 0.0, 0.0, 0.0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        """Token counts of the last record from TRL's mean completion length (logged right after ``on_step_end``)."""
        if self.steps and logs and "completions/mean_length" in logs:
            tokens = round(self.work.rows * float(logs["completions/mean_length"]))
            self.steps[-1].update(generated_tokens=tokens, trained_tokens=tokens * self.work.ppo_epochs)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start the optimizer-step clocks."""
        self._sync()
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Add the optimizer step; close the rollout's record after ``num_iterations`` of them."""
        self._sync()
        self._seconds += time.perf_counter() - self._start
        self._cpu_seconds += time.process_time() - self._cpu_start
        if state.global_step % self.work.ppo_epochs:
            return
        events, rows = self.profiles.take(), self.work.rows
        self.steps.append(
            {
                "step_seconds": self._seconds,
                "step_cpu_seconds": self._cpu_seconds,
                "phases": _phases(events, self.work, self._seconds, cpu=False),
                "cpu_phases": _phases(events, self.work, self._cpu_seconds, cpu=True),
                "generated_tokens": rows * self.work.max_new_tokens,  # corrected by on_log when lengths vary
                "trained_tokens": rows * self.work.max_new_tokens * self.work.ppo_epochs,
                "completion_lengths": self.lengths.rollouts[-1] if self.lengths.rollouts else None,
            }
        )
        self._seconds = self._cpu_seconds = 0.0


def _model_init_kwargs(work: Workload) -> dict[str, Any]:
    """``from_pretrained`` arguments: the dtype and, with ``--quantization``, our side's ``BitsAndBytesConfig``."""
    if work.quantization == "none":
        return {"dtype": work.torch_dtype}
    from lightning_grpo.policy.quantization import bnb_config

    config = bnb_config(work.quantization, double_quantization=True, compute_dtype=work.torch_dtype)
    return {"dtype": work.torch_dtype, "quantization_config": config}


def _config(work: Workload, output_dir: str) -> Any:
    from trl import GRPOConfig

    device = work.resolved_device()
    return GRPOConfig(
        output_dir=output_dir,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=device == "cpu",
        bf16=work.dtype == "bfloat16",
        fp16=work.dtype == "float16",
        model_init_kwargs=_model_init_kwargs(work),
        seed=work.seed,
        data_seed=work.seed,
        max_steps=(work.warmup_steps + work.steps) * work.ppo_epochs,
        per_device_train_batch_size=work.micro,
        gradient_accumulation_steps=work.rows // work.micro,
        num_generations=work.num_generations,
        num_iterations=work.ppo_epochs,
        shuffle_dataset=False,
        max_completion_length=work.max_new_tokens,
        generation_kwargs={"min_new_tokens": work.max_new_tokens} if work.fixed_length else None,
        temperature=work.temperature,
        top_p=1.0,
        top_k=0,
        beta=work.kl_coef,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        use_bias_correction_kl=False,
        mask_truncated_completions=False,
        gradient_checkpointing=work.gradient_checkpointing,
        learning_rate=work.lr,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        optim="adamw_torch",
        dataloader_num_workers=0,
    )


def run_trl(work: Workload, model_dir: Path) -> dict[str, Any]:
    """Train the same number of rollouts with ``trl.GRPOTrainer``; return per-rollout records."""
    import trl
    from trl import GRPOTrainer

    profiles = _Profiles()
    profiles.install()
    tokenizer = load_tokenizer(model_dir)
    prompts = make_prompts(tokenizer, work.prompts, work.prompt_length, work.seed)
    lora = LoraConfig(
        r=work.lora_r, lora_alpha=work.alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )  # exactly the adapter lightning_grpo.policy.load_policy builds
    reward = _LengthRecorder()
    clock = _StepClock(work, profiles, work.resolved_device(), reward)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=[reward],
            args=_config(work, output_dir),
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[clock],
        )
        lengths = work.scripted_lengths()
        if lengths is not None:  # forced while TRL's "transformers.generate" block runs, on the model it samples from
            sampling = lambda: any(name == "transformers.generate" for name, _ in profiles.stack)  # noqa: E731
            ScriptedEOS(lengths, work.prompt_length, tokenizer.eos_token_id, active=sampling).attach(trainer.model)
        trainer.train()
    return {"steps": clock.steps, "framework": f"trl {trl.__version__}"}
