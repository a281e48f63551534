"""The CUDA paths: whole fits, exact sampling log-probs, QLoRA and NCCL, on a GPU (skipped without CUDA).

The CPU suite proves these paths on the CPU and, with torch's default device on ``meta``, that no tensor is made on
the wrong device (``tests/module/test_foreign_device.py``); these tests run the same code on a real GPU. Run them with
``python -m pytest tests/gpu -m gpu`` on a machine with CUDA (figures and commands: docs/benchmarks.md, "GPU").
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from lightning_grpo import PolicyConfig
from lightning_grpo.config import ObjectiveConfig
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout.generation import generate_rollout
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, prompt_loader
from tests.module.test_foreign_device import CASES
from tests.process_supervision.test_process_estimator_fit import halves

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["1+1=", "2+3="]


def noise(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A reward with spread in every group, so that every update has non-zero advantages (a gradient reaches B)."""
    draw = random.Random(0)
    return [draw.random() for _ in completions]


def _adapter(module) -> dict[str, torch.Tensor]:
    """The trainable weights, whole (an FSDP2 shard is gathered), on the CPU."""
    weights = {n: p.detach() for n, p in module.policy.named_parameters() if p.requires_grad}
    return {n: getattr(w, "full_tensor", lambda w=w: w)().cpu().clone() for n, w in weights.items()}


class _Devices(Callback):
    """Records where the policy's weights are while the fit runs (Lightning moves the module back at the end)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen = {p.device.type for p in pl_module.policy.parameters()}


def _fit_on_gpu(module, steps: int = 2, callbacks=(), **trainer_options):
    before, devices = _adapter(module), _Devices()
    trainer = make_trainer(accelerator="gpu", max_steps=steps, callbacks=[devices, *callbacks], **trainer_options)
    trainer.fit(module, prompt_loader(PROMPTS, repeat=steps))
    assert trainer.global_step >= steps
    assert devices.seen == {"cuda"}
    for name, value in trainer.callback_metrics.items():
        assert math.isfinite(float(value)), name
    after = _adapter(module)
    moved = [n for n in before if "lora_B" in n and not torch.equal(before[n], after[n])]
    assert moved, "no lora_B weight moved (they start at zero: only a gradient moves them)"
    return trainer


@pytest.mark.parametrize("settings", CASES.values(), ids=CASES.keys())
def test_a_fit_on_cuda_trains_the_adapter(make_module, settings):
    process = "advantages" in settings and settings["advantages"].advantage_estimator == "grpo_process"
    functions = [halves, noise] if process else [noise]
    trainer = _fit_on_gpu(make_module(functions, **settings))
    assert {"train/reward_mean", "train/loss", "train/clip_frac"} <= set(trainer.callback_metrics)


def test_a_bfloat16_base_trains_a_float32_adapter_on_cuda(make_module):
    module = make_module(
        [noise], policy=PolicyConfig(lora_r=4, lora_alpha=8, dtype="bfloat16"), objective=ObjectiveConfig(kl_coef=0.01)
    )
    _fit_on_gpu(module)
    dtypes = {p.dtype for p in module.policy.parameters() if p.requires_grad}
    frozen = {p.dtype for p in module.policy.parameters() if not p.requires_grad}
    assert dtypes == {torch.float32} and frozen == {torch.bfloat16}


#: Every decode path: Hugging Face ``generate`` (shared prefill or not, static cache compiled) and our own loop.
DECODE_PATHS = {
    "generate, shared prefill": {},
    "generate, prefill per sample": {"share_prompt": False},
    "generate, static cache compiled": {"static_cache": True},
    "own loop, inverse_cdf": {"sampler": "inverse_cdf"},
    "own loop, drop finished": {"drop_finished": True},
    "own loop, inverse_cdf, drop finished": {"sampler": "inverse_cdf", "drop_finished": True},
}


@pytest.mark.parametrize("path", DECODE_PATHS.values(), ids=DECODE_PATHS.keys())
def test_every_decode_path_records_the_log_probs_training_computes(tokenizer, path):
    model = build_tiny_model(tokenizer).cuda().eval()
    settings = SamplingSettings(num_generations=4, max_new_tokens=12, temperature=0.7, **path)
    torch.manual_seed(0)
    with torch.no_grad():
        rollout = generate_rollout(model, tokenizer, ["1+2=", "33+4="], settings, max_prompt_length=16)
        sampled = rollout.sampled_mask.bool()
        assert rollout.completion_ids.is_cuda and sampled.sum() > len(rollout)
        for share_prompt in (True, False):
            for fused_head in (True, False):
                options = {"share_prompt": share_prompt, "fused_head": fused_head}
                ours = completion_logprobs(model, rollout, temperature=0.7, **options).logprobs
                torch.testing.assert_close(ours[sampled], rollout.logprobs[sampled], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_a_quantized_base_trains_its_adapter_on_cuda(make_module, quantization):
    pytest.importorskip("bitsandbytes")
    dtype = "bfloat16" if quantization == "int8" else "float32"
    module = make_module([noise], policy=PolicyConfig(lora_r=4, lora_alpha=8, quantization=quantization, dtype=dtype))
    base = {n: p.detach().clone() for n, p in module.policy.state_dict().items() if "lora_" not in n}
    _fit_on_gpu(module)
    after = module.policy.state_dict()
    assert all(torch.equal(base[n].cpu(), after[n].cpu()) for n in base), "the quantized base must not change"


class _Backend(Callback):
    """Records the process group's backend and world size while the fit runs."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen = (torch.distributed.get_backend(), torch.distributed.get_world_size())


STRATEGIES = {
    "ddp": lambda: DDPStrategy(process_group_backend="nccl"),
    "fsdp2": lambda: ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1),
}


@pytest.mark.parametrize("name", STRATEGIES, ids=STRATEGIES)
def test_world_size_one_fits_on_nccl(make_module, name):
    """Run each strategy in its own process (``-k ddp``, ``-k fsdp2``): a process group lives until the process ends."""
    backend = _Backend()
    _fit_on_gpu(
        make_module([noise], objective=ObjectiveConfig(kl_coef=0.01)), strategy=STRATEGIES[name](), callbacks=[backend]
    )
    assert backend.seen == ("nccl", 1)
