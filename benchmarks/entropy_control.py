"""Entropy control against entropy collapse: the tool-calling example at its old learning rate, with and without.

``examples/tool_calling.py`` at ``--lr 1e-2`` (its rate before it was lowered to 3e-3 because "1e-2 collapses")
drives the policy's entropy toward 0 within a few steps. Both arms train the same warm model (same seed, same
prompts, same settings); the only difference is the entropy control:

* ``baseline``: no entropy bonus (``entropy_coef=0``, the example's setting);
* ``adaptive``: ``entropy_control="adaptive"`` (Skywork-OR1; ``target`` 0.35 nats, TRL's defaults otherwise:
  ``delta=0.005``, ``coef_max=1``).

Figures per arm: the mean reward of the first and last quarter of the steps, and the mean and the minimum of the
step entropy (``train/entropy``) over the last quarter. See docs/benchmarks.md ("Entropy control")::

    OMP_NUM_THREADS=1 python -m benchmarks.entropy_control --seed 7
    python -m benchmarks.learning --cases entropy_control --seeds 0 1 2 3 7 --capabilities native default --jobs 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from typing import Any

from lightning.pytorch.callbacks import LambdaCallback

from lightning_grpo.algorithms.entropy import entropy_controller

STEPS, LR, TARGET = 10, 1e-2, 0.35
ADAPTIVE = {"target": TARGET}  # TRL's defaults otherwise: delta 0.005, coef_min 0, coef_max 1


def run_arm(seed: int, adaptive: bool, steps: int = STEPS, lr: float = LR, out: str | None = None) -> dict[str, float]:
    """One arm: the tool example's module at ``lr`` for ``steps`` steps; reward and entropy figures."""
    from examples import tool_calling

    out = out or tempfile.mkdtemp(prefix="entropy-control-")
    options = tool_calling.parse(
        ["--seed", str(seed), "--max-steps", str(steps), "--lr", str(lr), "--output-dir", out, "--no-progress-bar"]
    )
    module, data, trainer = tool_calling.build(options)
    if adaptive:  # the example's config with the adaptive control: the module's controller rebuilt from it
        objective = dataclasses.replace(
            module.config.objective, entropy_control="adaptive", entropy_control_args=ADAPTIVE
        )
        cfg = module.config = dataclasses.replace(module.config, objective=objective)
        module.entropy_control = entropy_controller(
            cfg.objective.entropy_control, cfg.objective.entropy_control_args, 0.0, shared=False
        )
        module.entropy_coef = module.entropy_control(None)
    rewards: list[float] = []
    entropy: list[float] = []
    coefs: list[float] = []

    def record(trainer: Any, module: Any, output: Any, *_: Any) -> None:
        rewards.append(float(output["rewards"].rewards.nanmean()))
        entropy.append(float(output["metrics"]["entropy"]))
        coefs.append(float(output["metrics"].get("entropy_coef", 0.0)))

    trainer.callbacks.append(LambdaCallback(on_train_batch_end=record))
    trainer.fit(module, data)
    q = max(len(rewards) // 4, 1)
    return {
        "reward_first": sum(rewards[:q]) / q,
        "reward_last": sum(rewards[-q:]) / q,
        "entropy_first": sum(entropy[:q]) / q,
        "entropy_last": sum(entropy[-q:]) / q,
        "entropy_last_min": min(entropy[-q:]),
        "coef_max": max(coefs),
    }


def compare_arms(seed: int) -> dict[str, float]:
    """Both arms at ``seed``: each figure prefixed by its arm, and the differences of the last-quarter figures."""
    base, adaptive = run_arm(seed, adaptive=False), run_arm(seed, adaptive=True)
    figures = {f"baseline_{k}": v for k, v in base.items()} | {f"adaptive_{k}": v for k, v in adaptive.items()}
    figures["entropy_gain"] = adaptive["entropy_last"] - base["entropy_last"]
    figures["reward_gain"] = adaptive["reward_last"] - base["reward_last"]
    return figures


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Print both arms' figures at ``--seed`` as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--arm", choices=["baseline", "adaptive", "both"], default="both")
    args = parser.parse_args(argv)
    both = args.arm == "both"
    figures = compare_arms(args.seed) if both else run_arm(args.seed, adaptive=args.arm == "adaptive")
    print(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
