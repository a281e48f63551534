"""A whole GRPO iteration creates its tensors on the device of its inputs (docs/benchmarks.md, "GPU readiness").

From the scoring of the rollout to the last callback's statistics, each step of ``training_step`` and every default
callback's ``on_train_batch_end`` runs with torch's default device set to ``meta`` while the model and the data live
on the CPU: a tensor made without ``device=`` lands on meta and mixing it with the CPU ones raises, as a CPU tensor
mixed with CUDA ones does on a GPU (the crash of ``grpo_process``'s statistics was one). Host-side values (reward
lists, step rewards built from text offsets) must say ``device="cpu"`` and move. Sampling is replaced by a fixed
rollout (the tokenizer makes its tensors on the default device) and Lightning's own logging runs on the CPU.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

import pytest
import torch

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.config import AdvantageConfig, ObjectiveConfig, SamplingConfig, UpdateConfig
from lightning_grpo.testing import build_tiny_model
from tests.conftest import count_a, make_trainer, prompt_loader
from tests.module.helpers import FixedRolloutModule, fixed_rollout
from tests.process_supervision.test_process_estimator_fit import halves


class ForeignDefaultDevice(FixedRolloutModule):
    """Each iteration and its callbacks' ``on_train_batch_end`` run with the default device on ``meta``."""

    def on_train_batch_start(self, batch, batch_idx):
        self._meta = ExitStack()
        self._meta.enter_context(torch.device("meta"))

    def on_train_batch_end(self, outputs, batch, batch_idx):  # after every callback's on_train_batch_end
        self._meta.close()

    def log(self, *args, **kwargs):  # Lightning's result collection makes its own tensors
        with torch.device("cpu"):
            super().log(*args, **kwargs)


class HostStepAdamW(torch.optim.AdamW):
    """AdamW whose step runs with the CPU as torch's default device.

    The optimizer is torch's, not the iteration's: torch 2.11's Adam/AdamW makes the lazily created ``state["step"]``
    counter with ``torch.tensor(0.0)`` on the default device (meta here), then ``.item()`` fails on it; torch 2.13
    passes ``device="cpu"`` there. On a GPU the default device stays the CPU, so only this test's meta device sees it.
    """

    def step(self, closure=None):
        with torch.device("cpu"):
            return super().step(closure)


CASES = {
    "defaults": {},
    "process": {"advantages": AdvantageConfig(advantage_estimator="grpo_process", process_outcome_weight=1.0)},
    "unfused, entropy bonus, no KL": {
        "update": UpdateConfig(fused_head=False),
        "objective": ObjectiveConfig(entropy_coef=0.01, kl_coef=0.0),
    },
    "rloo, two epochs of two mini-batches": {
        "advantages": AdvantageConfig(advantage_estimator="rloo"),
        "update": UpdateConfig(ppo_epochs=2, mini_batch_size=2),
    },
    "gspo, micro-batches of one": {
        "objective": ObjectiveConfig(loss_kind="gspo", loss_agg_mode="seq-mean-token-sum"),
        "update": UpdateConfig(micro_batch_size=1),
    },
    "batch scale, reinforce++": {
        "advantages": AdvantageConfig(advantage_estimator="reinforce_pp_baseline", advantage_scale="batch"),
    },
}


@pytest.mark.parametrize("settings", CASES.values(), ids=CASES.keys())
def test_an_iteration_makes_its_tensors_on_the_inputs_device(tokenizer, settings):
    process = settings.get("advantages", AdvantageConfig()).advantage_estimator == "grpo_process"
    functions = [halves, count_a] if process else [count_a]
    grpo = GRPOConfig(sampling=SamplingConfig(num_generations=2, max_new_tokens=6, max_prompt_length=16), **settings)
    module = ForeignDefaultDevice(build_tiny_model(tokenizer), functions, tokenizer=tokenizer, grpo=grpo,
                                  policy=PolicyConfig(lora_r=4, lora_alpha=8),
                                  optimizer=lambda params: HostStepAdamW(params, lr=1e-2))  # fmt: skip
    prompts = ["1+1=", "1+1=", "2+3=", "2+3="]
    module.fixed = fixed_rollout(tokenizer, prompts, ["aab", "b...", "aaaa", "ba"], group_size=2)
    trainer = make_trainer(max_steps=2)
    trainer.fit(module, prompt_loader(["1+1=", "2+3="], repeat=2))
    assert trainer.global_step >= 2
    metrics = trainer.callback_metrics
    assert {"train/reward_mean", "train/loss", "train/clip_frac", "train/zero_std_frac"} <= set(metrics)
    for name, value in metrics.items():
        assert value.device.type == "cpu" and math.isfinite(float(value)), name
    if process:
        assert float(metrics["train/process/steps_mean"]) > 0
