"""Our side: the real ``GRPOModule`` driven by a Lightning ``Trainer`` on fixed prompts."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.utils.data import DataLoader

from benchmarks.measure import reset_peak_rss, rss_bytes, trim_heap
from benchmarks.models import load_tokenizer
from benchmarks.uneven import ScriptedEOS
from benchmarks.workload import Workload, fraction_of_sevens, make_prompts
from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, Rollout
from lightning_grpo.config import CorrectionConfig, ObjectiveConfig, SamplingConfig, UpdateConfig
from lightning_grpo.iteration import UpdateBatch
from lightning_grpo.rewards import RewardScores
from lightning_grpo.rollout import SamplingSettings, TokenLogProbs

__all__ = ["BenchModule", "StepRecorder", "run_ours"]

PHASES = ("generate", "score", "old_logprobs", "reference", "update")


class BenchModule(GRPOModule):
    """``GRPOModule`` with the benchmark's extra settings and per-phase CPU-time accounting.

    :meth:`sampling_settings` and :meth:`logprob_settings` are overridden only to pass settings ``GRPOConfig`` does
    not expose (``min_new_tokens``; separate log-prob switches); :meth:`generate`, :meth:`score`,
    :meth:`compute_logprobs` and :meth:`update_policy` only add CPU-time accounting.
    """

    def __init__(
        self,
        *args: Any,
        sampling: Mapping[str, Any],
        logprob_options: Mapping[str, Any],
        scripted: ScriptedEOS | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.extra_sampling, self.logprob_options = dict(sampling), dict(logprob_options)
        self.scripted = scripted.attach(self.policy) if scripted is not None else None
        self.cpu_seconds: dict[str, float] = {}
        self.phase_peak_rss: dict[str, int] = {}
        self.step_peak_rss = 0

    @contextmanager
    def _cpu(self, phase: str) -> Iterator[None]:
        """CPU seconds of ``phase`` and, on Linux, its peak RSS (the peak is reset around it; ``step_peak_rss``
        keeps the largest peak seen in the step, so the step's own peak survives the resets)."""
        start = time.process_time()
        self.step_peak_rss = max(self.step_peak_rss, rss_bytes("VmHWM") or 0)
        reset = reset_peak_rss()
        try:
            yield
        finally:
            self.cpu_seconds[phase] = self.cpu_seconds.get(phase, 0.0) + time.process_time() - start
            if reset:
                peak = rss_bytes("VmHWM") or 0
                self.phase_peak_rss[phase] = max(self.phase_peak_rss.get(phase, 0), peak)
                self.step_peak_rss = max(self.step_peak_rss, peak)
                reset_peak_rss()

    def compute_logprobs(
        self, rollout: Rollout, *, reference: bool = False, with_entropy: bool = False
    ) -> TokenLogProbs:
        """As :meth:`GRPOModule.compute_logprobs` (CPU time of the fixed passes recorded)."""
        phase = "reference" if reference else ("old_logprobs" if not torch.is_grad_enabled() else None)
        with self._cpu(phase) if phase else nullcontext():
            return super().compute_logprobs(rollout, reference=reference, with_entropy=with_entropy)

    def logprob_settings(self) -> dict[str, Any]:
        """The module's settings with the benchmark's separate log-prob switches (``share_prompt``, ``fused_head``)."""
        return {**super().logprob_settings(), **self.logprob_options}

    def sampling_settings(
        self, *, num_generations: int | None = None, temperature: float | None = None
    ) -> SamplingSettings:
        """As :meth:`GRPOModule.sampling_settings`, with the workload's extra switches (e.g. ``min_new_tokens``)."""
        settings = super().sampling_settings(num_generations=num_generations, temperature=temperature)
        return replace(settings, **self.extra_sampling)

    def generate(
        self,
        batch: Mapping[str, Sequence[Any]],
        *,
        num_generations: int | None = None,
        temperature: float | None = None,
    ) -> Rollout:
        """As :meth:`GRPOModule.generate` (CPU time recorded; the scripted lengths forced, if any)."""
        with self._cpu("generate"), self.scripted.sampling() if self.scripted is not None else nullcontext():
            return super().generate(batch, num_generations=num_generations, temperature=temperature)

    def score(self, rollout: Rollout) -> RewardScores:
        """As :meth:`GRPOModule.score` (CPU time recorded)."""
        with self._cpu("score"):
            return super().score(rollout)

    def update_policy(self, batch: UpdateBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """As :meth:`GRPOModule.update_policy` (CPU time recorded)."""
        with self._cpu("update"):
            return super().update_policy(batch)


class StepRecorder(Callback):
    """Wall and CPU time of every training step, the module's per-phase timings and token counts."""

    def __init__(self, device: str) -> None:
        self.device, self.steps, self._start, self._cpu_start = device, [], 0.0, 0.0
        self._rss_start: int | None = None
        self._rss_file_start: int | None = None
        self._peak_reset = False
        self.peak_before_reset = 0

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        """Start the step clocks; read the RSS and reset the peak RSS, so that the step's own peak can be read."""
        self._sync()
        pl_module.cpu_seconds, pl_module.phase_peak_rss = {}, {}
        self.peak_before_reset = max(self.peak_before_reset, rss_bytes("VmHWM") or 0)  # loading, earlier steps
        trim_heap()
        self._rss_start, self._rss_file_start = rss_bytes(), rss_bytes("RssFile")
        self._peak_reset = reset_peak_rss()  # resets ru_maxrss too: peak_before_reset keeps what came before
        pl_module.step_peak_rss = 0
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        """Record the step: seconds (wall and CPU), phases, generated and trained tokens."""
        self._sync()
        seconds, cpu_seconds = time.perf_counter() - self._start, time.process_time() - self._cpu_start
        timings = outputs["timings"]
        self.steps.append(
            {
                "step_seconds": seconds,
                "step_cpu_seconds": cpu_seconds,
                "phases": {phase: float(timings.get(phase, 0.0)) for phase in PHASES},
                "cpu_phases": {phase: pl_module.cpu_seconds.get(phase, 0.0) for phase in PHASES},
                "generated_tokens": int(outputs["rollout"].completion_mask.sum()),
                "completion_lengths": outputs["rollout"].completion_mask.sum(-1).tolist(),
                "trained_tokens": int(outputs["loss_mask"].sum()) * pl_module.config.update.ppo_epochs,
                "rss_start_bytes": self._rss_start,  # weights, adapter, optimizer state (from step 2), libraries
                "step_peak_rss_bytes": self._step_peak(pl_module),  # this step's peak alone
                "phase_peak_rss_bytes": dict(pl_module.phase_peak_rss),  # each phase's peak RSS
                "rss_file_start_bytes": self._rss_file_start,  # of which mapped files (safetensors weights)
            }
        )

    def _step_peak(self, pl_module: L.LightningModule) -> int | None:
        """The step's peak RSS: the largest of its phases' peaks and of what ran between them."""
        if not self._peak_reset:
            return None
        return max(pl_module.step_peak_rss, rss_bytes("VmHWM") or 0)


def _module(work: Workload, model_dir: Path) -> BenchModule:
    policy = PolicyConfig(
        lora_r=work.lora_r,
        lora_alpha=work.alpha,
        dtype=work.dtype,
        gradient_checkpointing=work.gradient_checkpointing,
        quantization=None if work.quantization == "none" else work.quantization,
    )
    grpo = GRPOConfig(
        sampling=SamplingConfig(
            num_generations=work.num_generations,
            max_prompt_length=work.prompt_length,
            max_new_tokens=work.max_new_tokens,
            temperature=work.temperature,
            decode=work.decode,
        ),
        update=UpdateConfig(
            ppo_epochs=work.ppo_epochs,
            micro_batch_size=work.micro,
            micro_batch_tokens=work.micro_batch_tokens or None,
            packing={"true": True, "false": False}.get(work.packing, work.packing),
            max_grad_norm=1.0,
        ),
        objective=ObjectiveConfig(kl_coef=work.kl_coef, dual_clip=None, loss_agg_mode="token-mean"),
        corrections=CorrectionConfig(old_logprobs=work.old_logprobs),
    )
    sampling = {"min_new_tokens": work.max_new_tokens if work.fixed_length else 0, "share_prompt": work.share_prompt}
    sampling.update(static_cache=work.static_cache, sampler=work.sampler, drop_finished=work.drop_finished)
    tokenizer = load_tokenizer(model_dir)
    lengths = work.scripted_lengths()
    scripted = None if lengths is None else ScriptedEOS(lengths, work.prompt_length, tokenizer.eos_token_id)
    return BenchModule(
        str(model_dir),
        [fraction_of_sevens],
        tokenizer=tokenizer,
        policy=policy,
        grpo=grpo,
        optimizer=lambda params: torch.optim.AdamW(params, lr=work.lr, weight_decay=0.0),
        seed=work.seed,
        sampling=sampling,
        logprob_options={"share_prompt": work.share_prompt_logprobs, "fused_head": work.fused_head},
        scripted=scripted,
    )


def run_ours(work: Workload, model_dir: Path) -> dict[str, Any]:
    """Train ``warmup_steps + steps`` GRPO steps; return the per-step records and the loaded-model memory."""
    libraries_rss = rss_bytes()  # torch, transformers, peft, bitsandbytes, lightning imported; no model yet
    module = _module(work, model_dir)
    prompts = make_prompts(module.tokenizer, work.prompts, work.prompt_length, work.seed)
    rows = [{"prompt": p} for p in prompts] * (work.warmup_steps + work.steps)
    loader = DataLoader(rows, batch_size=work.prompts, collate_fn=lambda b: {"prompt": [r["prompt"] for r in b]})
    device = work.resolved_device()
    recorder = StepRecorder(device)
    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        max_steps=work.warmup_steps + work.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[recorder],
    )
    trainer.fit(module, loader)
    framework = f"lightning_grpo (lightning {L.__version__})"
    steps = recorder.steps
    return {
        "steps": steps,
        "framework": framework,
        "libraries_rss_bytes": libraries_rss,
        # the peak RSS is reset at every step and phase: the process peak is the largest of these and ru_maxrss
        "peak_before_reset_bytes": max([recorder.peak_before_reset, *(s["step_peak_rss_bytes"] or 0 for s in steps)]),
    }
