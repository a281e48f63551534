"""Dynamic sampling vs none on a task where most groups start all-wrong: success rate per generated token.

The tiny model is warmed up on ``addition`` with mostly wrong labels (``label_accuracy``), so it knows the format but is
right a few percent of the time: with ``G`` samples most groups are all wrong (zero variance, no signal). Both arms
train the same model, data order and settings with the same budget of generated tokens; the only difference is
``GRPOConfig(advantages=AdvantageConfig(dynamic_sampling=...))``. The success rate is measured on every completion
sampled (kept or filtered), so it is the policy's accuracy at that point, and it is plotted against the tokens generated
so far. See the "Dynamic sampling" section of docs/benchmarks.md::

    OMP_NUM_THREADS=1 python -m benchmarks.dynamic_sampling --out runs/dynamic-sampling   # ~5 min on one CPU core
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import AdvantageConfig, ObjectiveConfig, SamplingConfig
from lightning_grpo.rewards import math_answer
from lightning_grpo.testing import TinyTaskDataModule, WarmupSettings, build_tiny_tokenizer, load_tiny_model

__all__ = ["compare_arms", "main", "run_arm"]

WARMUP = WarmupSettings(label_accuracy=0.03)


class TokenCounter:
    """A reward of weight 0 that records, per call, the tokens generated, the mean exact-answer reward and the
    fraction of groups (``G`` consecutive rows) with no right answer."""

    __name__ = "token_counter"

    def __init__(self, group_size: int = 8) -> None:
        self.calls: list[tuple[int, float]] = []
        self.all_wrong: list[float] = []
        self.group_size = group_size

    def __call__(self, prompts: list, completions: list, answer: list, completion_ids: list, **_: Any) -> list[float]:
        right = [r or 0.0 for r in math_answer(prompts, completions, answer)]
        self.calls.append((sum(len(ids) for ids in completion_ids), sum(right) / len(right)))
        groups = [right[i : i + self.group_size] for i in range(0, len(right), self.group_size)]
        self.all_wrong.append(sum(not any(g) for g in groups) / len(groups))
        return [0.0] * len(completions)


class StopAtBudget(Callback):
    """Stops training once ``budget`` tokens were generated."""

    def __init__(self, counter: TokenCounter, budget: int) -> None:
        self.counter, self.budget = counter, budget

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if sum(tokens for tokens, _ in self.counter.calls) >= self.budget:
            trainer.should_stop = True


def run_arm(dynamic: bool, seed: int, budget: int, lr: float = 3e-3) -> dict[str, Any]:
    """Train one arm until ``budget`` generated tokens; return its curve ``(tokens so far, success rate)``."""
    L.seed_everything(seed, verbose=False)
    tokenizer, counter = build_tiny_tokenizer(), TokenCounter()
    module = GRPOModule(
        load_tiny_model("addition", settings=WARMUP),
        {"math_answer": math_answer, "tokens": counter},
        tokenizer=tokenizer,
        reward_weights=[1.0, 0.0],
        policy=PolicyConfig(lora_r=8, lora_alpha=16, target_modules="all-linear", dtype="float32"),
        grpo=GRPOConfig(
            sampling=SamplingConfig(num_generations=8, max_prompt_length=8, max_new_tokens=3),
            objective=ObjectiveConfig(kl_coef=0.001),
            advantages=AdvantageConfig(dynamic_sampling=dynamic, max_sampling_rounds=8),
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.0),
    )
    data = TinyTaskDataModule("addition", batch_size=8, seed=seed)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=100_000,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StopAtBudget(counter, budget)],
    )
    start = time.perf_counter()
    trainer.fit(module, data)
    tokens, curve = 0, []
    for n, rate in counter.calls:
        tokens += n
        curve.append((tokens, rate))
    start_wrong = counter.all_wrong[:10]  # the first 10 scoring calls
    return {
        "dynamic": dynamic,
        "seed": seed,
        "steps": trainer.global_step,
        "seconds": time.perf_counter() - start,
        "curve": curve,
        "start_all_wrong_frac": sum(start_wrong) / len(start_wrong),
    }


def rate_at(curve: list[tuple[int, float]], lo: float, hi: float) -> float:
    """Mean success rate of the samples drawn while the token count was in ``(lo, hi]``."""
    values = [rate for tokens, rate in curve if lo < tokens <= hi]
    return sum(values) / max(len(values), 1)


def compare_arms(seed: int, budget: int = 120_000, lr: float = 3e-3) -> dict[str, float]:
    """Both arms for one seed: success rates over the first and last quarter of the token budget, optimizer steps."""
    figures = {}
    for arm, dynamic in (("dynamic", True), ("baseline", False)):
        run = run_arm(dynamic, seed=seed, budget=budget, lr=lr)
        figures[f"{arm}_first"] = rate_at(run["curve"], 0, 0.25 * budget)
        figures[f"{arm}_last"] = rate_at(run["curve"], 0.75 * budget, budget)
        figures[f"{arm}_steps"] = run["steps"]
        figures[f"{arm}_all_wrong_at_start"] = run["start_all_wrong_frac"]
    return figures


def summarize(runs: list[dict[str, Any]], budget: int, bins: int = 4) -> dict[str, list[float]]:
    """Per arm, the success rate in each quarter of the token budget, averaged over seeds."""
    table: dict[str, list[float]] = {}
    for arm, dynamic in (("dynamic_sampling", True), ("baseline", False)):
        arm_runs = [r for r in runs if r["dynamic"] is dynamic]
        table[arm] = [
            sum(rate_at(r["curve"], budget * i / bins, budget * (i + 1) / bins) for r in arm_runs) / len(arm_runs)
            for i in range(bins)
        ]
    return table


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Success rate against generated tokens, one line per run (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for run in runs:
        tokens = [t for t, _ in run["curve"]]
        window = 20
        rates = [r for _, r in run["curve"]]
        smooth = [
            sum(rates[max(0, i - window + 1) : i + 1]) / len(rates[max(0, i - window + 1) : i + 1])
            for i in range(len(rates))
        ]
        label = f"{'dynamic sampling' if run['dynamic'] else 'baseline'} (seed {run['seed']})"
        axes.plot(tokens, smooth, color="C0" if run["dynamic"] else "C1", alpha=0.8, label=label)
    axes.set(xlabel="generated tokens", ylabel="success rate (moving average)", ylim=(0, 1))
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both arms for each seed; write ``results.json`` (and ``curve.png``) in ``--out``; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/dynamic-sampling"))
    parser.add_argument("--budget", type=int, default=120_000, help="generated tokens per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate of both arms")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*dynamic_sampling.*|.*zero variance.*")
    runs = [run_arm(dynamic, seed, args.budget, args.lr) for seed in args.seeds for dynamic in (False, True)]
    table = summarize(runs, args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"runs": runs, "table": table}, indent=1))
    try:
        plot(runs, args.out / "curve.png")
    except ImportError:
        print("curve.png skipped (pip install matplotlib)")
    quarters = " | ".join(f"{25 * (i + 1)}%" for i in range(4))
    print(f"| arm | {quarters} of {args.budget} tokens |")
    for arm, rates in table.items():
        print(f"| {arm} | " + " | ".join(f"{r:.3f}" for r in rates) + " |")
    return {"runs": runs, "table": table}


if __name__ == "__main__":
    main()
