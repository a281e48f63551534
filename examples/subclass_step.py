"""Change one phase of the GRPO iteration by subclassing ``GRPOModule``: here, a length penalty in the advantages.

Each phase of an iteration is one method: ``generate``, ``score``, ``compute_advantages``, ``prepare_update``,
``compute_loss``. Override one, call ``super()`` for the rest, and the loop, logging and distributed handling stay as
they are. ``LengthPenaltyGRPO`` subtracts ``length_penalty * completion_tokens / max_new_tokens`` from every reward
before the group-relative normalization, so among equally correct answers the shorter ones are reinforced.

    python examples/subclass_step.py                       # tiny model, CPU, offline
    python examples/subclass_step.py --length-penalty 0.5 --max-steps 50

From a YAML config (run from the repository root, so that ``examples`` is importable)::

    model:
      class_path: examples.subclass_step.LengthPenaltyGRPO
      init_args:
        length_penalty: 0.2
        model: {class_path: lightning_grpo.testing.TinyModel, init_args: {task: addition}}
        tokenizer: {class_path: lightning_grpo.testing.TinyTokenizer}
        reward_funcs: [lightning_grpo.rewards.math_answer]
"""

from __future__ import annotations

from lightning_grpo.cli.before_loading import announce_libraries

announce_libraries("examples/subclass_step.py")  # the imports below take seconds: never silent

import argparse
from collections.abc import Sequence
from typing import Any

import torch
from lightning import Trainer
from torch import Tensor

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule, Rollout
from lightning_grpo.config import SamplingConfig
from lightning_grpo.rewards import math_answer
from lightning_grpo.testing import TinyModel, TinyTokenizer, make_task


class LengthPenaltyGRPO(GRPOModule):
    """GRPO whose advantages penalize long completions.

    Args:
        *args: Passed to :class:`~lightning_grpo.GRPOModule`.
        length_penalty: Reward subtracted for a completion of ``max_new_tokens`` tokens (proportionally less for
            shorter ones); 0 gives plain GRPO.
        **kwargs: Passed to :class:`~lightning_grpo.GRPOModule`.
    """

    def __init__(self, *args: Any, length_penalty: float = 0.1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
        self.length_penalty = length_penalty

    def compute_advantages(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """Penalize length, then the usual group-relative advantages."""
        lengths = rollout.completion_lengths.to(rewards.dtype)  # (B*G,) tokens, EOS included
        shaped = rewards - self.length_penalty * lengths / self.config.sampling.max_new_tokens  # NaN rows stay NaN
        self.log("train/length_penalty", (rewards - shaped).nanmean(), batch_size=len(rollout))
        return super().compute_advantages(shaped, rollout)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults train the tiny model on CPU."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default=None, help="HF id or local path (None: the tiny model)")
    parser.add_argument("--train-data", default=None, help="JSONL/JSON path or hf:<name> (None: tiny sums)")
    parser.add_argument("--length-penalty", type=float, default=0.1)
    parser.add_argument("--max-steps", type=int, default=100, help="GRPO iterations")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=6, help="room for rambling, which the penalty curbs")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--num-threads", type=int, default=1, help="CPU threads (1 is fastest for tiny models)")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> LengthPenaltyGRPO:
    """Train the subclass; returns the trained module."""
    options = parse(argv)
    torch.set_num_threads(options.num_threads)
    model, tokenizer = (options.model, None) if options.model else (TinyModel("addition"), TinyTokenizer())
    module = LengthPenaltyGRPO(
        model,
        [math_answer],
        tokenizer=tokenizer,
        length_penalty=options.length_penalty,
        policy=PolicyConfig(lora_r=8, lora_alpha=16),
        grpo=GRPOConfig(
            sampling=SamplingConfig(
                num_generations=options.num_generations, max_new_tokens=options.max_new_tokens, max_prompt_length=16
            )
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0),
    )
    trainer = Trainer(
        accelerator=options.accelerator,
        devices=1,
        max_steps=options.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=options.progress_bar,
    )
    trainer.fit(module, PromptDataModule(options.train_data or make_task("addition"), batch_size=options.batch_size))
    logged = trainer.callback_metrics
    reward, length = (float(logged[name]) for name in ("train/reward_mean", "train/completion/length_mean"))
    print(f"subclass_step: last iteration's mean reward {reward:.2f}, mean completion length {length:.1f} tokens")
    return module


if __name__ == "__main__":
    main()
