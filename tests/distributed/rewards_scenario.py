"""The ``rewards`` scenario of :mod:`tests.distributed.worker`: a reward model and dynamic sampling on 2 ranks.

Ranks see different prompts, so they need different numbers of sampling rounds to fill their step; each records what
it scored, the logged metrics and where its reward model lives, for ``test_rewards.py`` to check.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from transformers import Qwen2ForSequenceClassification

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.config import AdvantageConfig, SamplingConfig
from lightning_grpo.rewards import RewardModel
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer, tiny_config
from tests.conftest import make_trainer
from tests.distributed.builders import G
from tests.distributed.ranks import logged, make_strategy, rank, world_of, write_json

#: 40 prompts per rank, 20 batches of 2: within one epoch for 2 steps even at 8 rounds each.
NUM_PROMPTS = 80


def has_signal(i: int) -> bool:
    """Prompt ``i`` carries signal on 1 of 3 of rank 0's prompts (even ``i``) but 1 of 5 of rank 1's (odd ``i``)."""
    return i % 6 == 0 or i % 10 == 1


def classifier() -> Qwen2ForSequenceClassification:
    """A tiny one-label classifier (seed 3), built identically on every rank and in the test."""
    config = tiny_config(build_tiny_tokenizer(), hidden_size=32, num_layers=1)
    config.num_labels = 1
    torch.manual_seed(3)
    return Qwen2ForSequenceClassification(config).eval()


class SignalOnSome:
    """Gives signal (a hash of the completion) only where :func:`has_signal`; records what it scored, per group."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompts: list, completions: list, signal: list, **_: Any) -> list[float]:
        self.prompts += [p for i, p in enumerate(prompts) if i % G == 0]
        return [zlib.crc32(c.encode()) % 1000 / 1000 if s else 0.0 for c, s in zip(completions, signal, strict=True)]


class StepRecorder(Callback):
    """Per step: the prompts trained on, the reward model's scores of its rows, the logged metrics."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        rollout, scores = outputs["rollout"], outputs["rewards"]
        self.steps.append(
            {
                "prompts": list(rollout.prompts),
                "completions": list(rollout.completions),
                "rm_scores": scores.per_function["tiny-rm"].tolist(),
                "metrics": logged(trainer),
            }
        )


def scenario_rewards(strategy: str, workdir: Path) -> None:
    """Fit 2 steps with dynamic sampling and a reward model of weight 0; write what this rank saw."""
    tokenizer, signal, recorder = build_tiny_tokenizer(), SignalOnSome(), StepRecorder()
    reward_model = RewardModel(classifier(), tokenizer, name="tiny-rm", batch_size=3)
    module = GRPOModule(
        build_tiny_model(tokenizer),
        {"signal": signal, "tiny-rm": reward_model},
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        reward_weights=[1.0, 0.0],
        grpo=GRPOConfig(
            sampling=SamplingConfig(num_generations=G, max_new_tokens=6, max_prompt_length=16),
            advantages=AdvantageConfig(dynamic_sampling=True, max_sampling_rounds=8),
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )
    records = [{"prompt": f"{i:02d}+1=", "signal": has_signal(i)} for i in range(NUM_PROMPTS)]
    data = PromptDataModule(records, batch_size=2, shuffle=False)
    trainer = make_trainer(
        devices=world_of(strategy),
        strategy=make_strategy(strategy),
        max_steps=2,
        callbacks=[recorder],
        log_every_n_steps=1,
    )
    trainer.fit(module, data)
    params = list(reward_model.model.parameters())
    optimized = {id(p) for group in module.optimizers().optimizer.param_groups for p in group["params"]}
    write_json(
        workdir / f"rewards-rank{rank()}.json",
        {
            "scored": signal.prompts,
            "steps": recorder.steps,
            "rm_device": str(params[0].device),
            "rm_dtype": str(params[0].dtype),
            "rm_sharded": any(type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor" for p in params),
            "rm_in_optimizer": any(id(p) in optimized for p in params),
            "rm_requires_grad": any(p.requires_grad for p in params),
            "rm_numel": sum(p.numel() for p in params),
        },
    )
