"""The modules and data that every rank and the single-process references build: the tiny GRPOModule and its settings.

:func:`build_module` is the one place a distributed test builds its module, so that each rank and the reference in
the test process start from the same weights (the tiny model, seed 0) and settings.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.rewards import StepRewards, step_reward
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.conftest import count_a, prompt_records

G = 4  # completions per prompt


@step_reward
def a_per_chunk(completions: list[str], **_: Any) -> list[StepRewards]:
    """Steps of three characters (the last may be shorter), each scored by its count of ``a``."""
    starts = lambda c: range(0, len(c), 3)  # noqa: E731
    return [
        StepRewards([c[i : i + 3].count("a") for i in starts(c)], [min(i + 3, len(c)) for i in starts(c)])
        for c in completions
    ]


def count_b(completions: list[str], **_: Any) -> list[float]:
    """The number of ``b`` in each completion (a second reward function, for ``gdpo``)."""
    return [float(c.count("b")) for c in completions]


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """``layers`` merged, a later one winning, group by group: ``{"update": {...}, "objective": {...}, ...}``."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = {**out[key], **value} if both else value
    return out


def build_module(
    module_cls: type[GRPOModule] = GRPOModule, *, lr: float = 1e-2, sgd: bool = False, **settings: Any
) -> GRPOModule:
    """A GRPOModule over the tiny model (seed 0), as every rank and the single-process reference build it;
    ``settings``: groups of ``GRPOConfig`` as dicts (``update={"micro_batch_size": 2}``), over the tiny sampling."""
    tokenizer = build_tiny_tokenizer()
    settings = merged({"sampling": {"num_generations": G, "max_new_tokens": 6, "max_prompt_length": 16}}, settings)
    policy = settings.pop("policy", PolicyConfig(lora_r=4, lora_alpha=8))
    scheduler = settings.pop("lr_scheduler", None)
    funcs = {"process": [count_a, a_per_chunk], "two": [count_a, count_b]}
    reward_funcs = funcs.get(settings.pop("reward_funcs", None), [count_a])
    optimizer = torch.optim.SGD if sgd else torch.optim.AdamW
    return module_cls(
        build_tiny_model(tokenizer),
        reward_funcs,
        tokenizer=tokenizer,
        policy=policy,
        grpo=GRPOConfig(**settings),
        optimizer=lambda params: optimizer(params, lr=lr),
        lr_scheduler=scheduler,
    )


def perturb_adapter(module: GRPOModule) -> None:
    """Move the adapter off its zero-B initialisation (seeded), so the KL term and every weight get a gradient."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in module.policy.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def _step_lr(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def fit_module() -> GRPOModule:
    """Sampling, KL, several optimizer steps per rollout, clipping, gradient checkpointing, a scheduler."""
    return build_module(
        policy=PolicyConfig(lora_r=4, lora_alpha=8, gradient_checkpointing=True),
        objective={"kl_coef": 0.01},
        update={"ppo_epochs": 2, "mini_batch_size": 4, "micro_batch_size": 2},
        lr_scheduler=_step_lr,
    )


def fit_data() -> PromptDataModule:
    """8 prompts in batches of 2: 2 batches per rank and epoch on 2 ranks."""
    return PromptDataModule(prompt_records(8), batch_size=2, seed=1)
