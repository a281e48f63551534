"""Your own reward functions, and a Lightning ``Trainer`` built in Python (no YAML).

A reward function is any callable ``fn(prompts, completions, **columns) -> list[float | None]``: it receives the
prompts and completions positionally and, by keyword, the dataset's columns (here ``answer``) plus extras such as
``completion_lengths`` (tokens). It names only the keywords it reads. ``None`` skips a row.

    python examples/custom_reward.py                       # tiny model, CPU, offline: about a minute
    python examples/custom_reward.py --max-steps 20        # shorter
    python examples/custom_reward.py --model Qwen/Qwen2.5-0.5B-Instruct --accelerator gpu --train-data data.jsonl

The same functions work from a YAML config: ``reward_funcs: [my_rewards.sum_from_prompt]`` (an import path).
"""

from __future__ import annotations

from lightning_grpo.cli.before_loading import announce_libraries

announce_libraries("examples/custom_reward.py")  # the imports below take seconds: never silent

import argparse
import re
from collections.abc import Sequence

import torch
from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.callbacks import CompletionStats, GroupRewardStats
from lightning_grpo.config import SamplingConfig
from lightning_grpo.demo import read_rewards, summarize
from lightning_grpo.testing import TinyModel, TinyTokenizer, make_task

_SUM = re.compile(r"(\d+)\+(\d+)=")


def sum_from_prompt(prompts: list[str], completions: list[str]) -> list[float | None]:
    """1.0 when the completion is the sum the prompt ``"a+b="`` asks for; ``None`` for prompts of another kind.

    It reads the prompt itself, so no answer column is needed.
    """
    rewards: list[float | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        match = _SUM.search(prompt)
        rewards.append(None if match is None else float(completion.strip() == str(int(match[1]) + int(match[2]))))
    return rewards


def concise(
    prompts: list[str], completions: list[str], answer: list[str], completion_lengths: list[int]
) -> list[float]:
    """Up to 1.0 for a completion no longer than the reference answer plus its EOS token, falling off beyond."""
    return [min(1.0, (len(ref) + 1) / max(n, 1)) for ref, n in zip(answer, completion_lengths, strict=True)]


def build(options: argparse.Namespace) -> tuple[GRPOModule, PromptDataModule, Trainer]:
    """The module (two weighted reward functions), the data module and the trainer."""
    model, tokenizer = (options.model, None) if options.model else (TinyModel("addition"), TinyTokenizer())
    module = GRPOModule(
        model,
        [sum_from_prompt, concise],
        tokenizer=tokenizer,
        reward_weights=[1.0, 0.1],
        policy=PolicyConfig(lora_r=8, lora_alpha=16, dtype=options.dtype),
        grpo=GRPOConfig(
            sampling=SamplingConfig(
                num_generations=options.num_generations,
                max_new_tokens=options.max_new_tokens,
                max_prompt_length=options.max_prompt_length,
            )
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0),
        seed=options.seed,
    )
    data = PromptDataModule(
        options.train_data or make_task("addition"), batch_size=options.batch_size, seed=options.seed
    )
    trainer = Trainer(
        accelerator=options.accelerator,
        devices=1,
        max_steps=options.max_steps,
        log_every_n_steps=1,
        logger=CSVLogger(options.output_dir, name="custom_reward"),
        callbacks=[GroupRewardStats(), CompletionStats()],
        enable_checkpointing=False,
        enable_progress_bar=options.progress_bar,
    )
    return module, data, trainer


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults train the tiny model on CPU."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default=None, help="HF id or local path (None: the tiny model)")
    parser.add_argument("--train-data", default=None, help="JSONL/JSON path or hf:<name> (None: tiny sums)")
    parser.add_argument("--max-steps", type=int, default=200, help="GRPO iterations")
    parser.add_argument("--num-generations", type=int, default=8, help="G, samples per prompt")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per iteration")
    parser.add_argument("--max-new-tokens", type=int, default=3)
    parser.add_argument("--max-prompt-length", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-threads", type=int, default=1, help="CPU threads (1 is fastest for tiny models)")
    parser.add_argument("--output-dir", default="runs")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Trainer:
    """Train, then print the mean reward of the first and last tenth of the iterations; returns the fitted trainer."""
    options = parse(argv)
    torch.set_num_threads(options.num_threads)
    module, data, trainer = build(options)
    trainer.fit(module, data)
    first, last = summarize(read_rewards(f"{trainer.logger.log_dir}/metrics.csv"))  # first and last tenth of steps
    print(f"logs: {trainer.logger.log_dir}")
    print(f"custom_reward: mean reward {first:.2f} -> {last:.2f} over {trainer.global_step} steps")
    return trainer


if __name__ == "__main__":
    main()
