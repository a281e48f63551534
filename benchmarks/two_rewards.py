"""GDPO and OPO against summed GRPO on a two-reward task where one reward's scale dominates the sum.

A random tiny model writes 8-token completions; ``a_count`` rewards the number of ``a`` characters (0 to 8) and
``b_frac`` the fraction of ``b`` characters (0 to 1), weights 1 and 1. The two compete for the same 8 tokens, and
the summed reward is ``a_count`` to within an eighth: summed GRPO learns ``a`` and all but ignores ``b``. GDPO
normalises each reward within its group before summing, so ``b`` weighs as much as ``a``. OPO (length-weighted
baseline on the sum) is run as the second new estimator. Every arm starts from the same seed::

    python -m benchmarks.two_rewards --seed 0        # one seed, the three arms, their figures as JSON
    python -m benchmarks.learning --cases two_rewards --seeds 0 1 2 3 4 --jobs 1
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["ARMS", "arm_curves", "compare_arms"]

#: The arms: their ``advantage_estimator``.
ARMS = ("grpo", "gdpo", "opo")
STEPS = 15
EDGE = 3  # steps averaged at each end of a curve


def a_count(completions: list[str], **_: Any) -> list[float]:
    """The number of ``a`` in each completion (the dominant reward: 0 to 8)."""
    return [float(c.count("a")) for c in completions]


def b_frac(completions: list[str], **_: Any) -> list[float]:
    """The fraction of ``b`` in each completion (the weak reward: 0 to 1)."""
    return [c.count("b") / max(len(c), 1) for c in completions]


def arm_curves(seed: int, estimator: str, steps: int = STEPS, lr: float = 1e-2) -> dict[str, list[float]]:
    """Mean of each reward per step for one arm."""
    import lightning as L
    import torch

    from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
    from lightning_grpo.config import AdvantageConfig, ObjectiveConfig, SamplingConfig
    from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

    tokenizer, curves = build_tiny_tokenizer(), {"a_count": [], "b_frac": []}
    module = GRPOModule(
        build_tiny_model(tokenizer, seed=seed),
        [a_count, b_frac],
        tokenizer=tokenizer,
        seed=seed,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(
            sampling=SamplingConfig(num_generations=8, max_new_tokens=8, max_prompt_length=16),
            objective=ObjectiveConfig(kl_coef=0.0),
            advantages=AdvantageConfig(advantage_estimator=estimator),
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
        default_callbacks=False,
    )

    def record(trainer: Any, module: Any, out: Any, *_: Any) -> None:
        for name, values in out["rewards"].per_function.items():
            curves[name].append(float(values.nanmean()))

    rows = [{"prompt": f"{i % 10}+{(i * 3) % 10}="} for i in range(64)]
    L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[L.pytorch.callbacks.LambdaCallback(on_train_batch_end=record)],
    ).fit(module, PromptDataModule(rows, batch_size=4, seed=seed))
    return curves


def _rise(curve: list[float]) -> float:
    return sum(curve[-EDGE:]) / EDGE - sum(curve[:EDGE]) / EDGE


def compare_arms(seed: int) -> dict[str, float]:
    """Each arm's rise of each reward (mean of the last 3 steps minus the first 3) and GDPO's gain on ``b_frac``."""
    figures: dict[str, float] = {}
    for arm in ARMS:
        curves = arm_curves(seed, arm)
        figures[f"{arm}_a_rise"] = _rise(curves["a_count"]) / 8  # as a fraction of the 8 tokens, like b_frac
        figures[f"{arm}_b_rise"] = _rise(curves["b_frac"])
    figures["gdpo_minus_grpo_b_rise"] = figures["gdpo_b_rise"] - figures["grpo_b_rise"]
    return figures


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the three arms at one seed and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    figures = compare_arms(parser.parse_args(argv).seed)
    print(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
