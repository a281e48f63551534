"""The GSM8K recipe in Python: GRPO with a LoRA adapter on Qwen2.5-0.5B-Instruct, one GPU.

The same run as ``configs/qwen2.5-0.5b/gsm8k-lora.yaml``, written out as code to read and adapt. It needs the model
and the dataset from the Hugging Face hub (the ``data`` extra, checked first: ``pip install -e ".[data]"`` in a clone)::

    python examples/gsm8k_lora.py                                   # 500 iterations on one GPU
    python examples/gsm8k_lora.py --model Qwen/Qwen2.5-1.5B-Instruct --lr 1e-5 --gradient-checkpointing
    python examples/gsm8k_lora.py --train-data my_questions.jsonl   # rows {"question": ..., "answer": "... #### 42"}

Without a network it stops within about two seconds (one connection attempt to the hub, :func:`check_hub`) and says
what to download (``hf download ...``) instead of retrying for a minute; with ``HF_HUB_OFFLINE=1`` it reads the local
Hugging Face cache without trying. ``docs/first-run.md`` walks through a first run on one GPU.

Recipe: G = 8 samples per question, reward = exact final answer (1.0) + ``<think>``/``<answer>`` format (0.2), KL
(k3, 0.001) to the base model, clip 0.2, token-mean loss, LoRA r = 16 / alpha = 32 on all linear layers, bf16 base
weights with an fp32 adapter (so the trainer's precision stays ``32-true``).
"""

from __future__ import annotations

from lightning_grpo.cli.before_loading import announce_libraries

announce_libraries("examples/gsm8k_lora.py")  # the imports below take seconds: never silent

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.callbacks import AdapterExport, default_callbacks
from lightning_grpo.config import ObjectiveConfig, SamplingConfig, UpdateConfig, ValidationConfig
from lightning_grpo.extras import exit_unless_installed
from lightning_grpo.policy.hub import hub_endpoint, hub_reachable
from lightning_grpo.rewards import FormatReward, math_answer

SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The Assistant "
    "first thinks about the reasoning process and then gives the user the answer. The reasoning process and the "
    "answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think> <answer> final answer (a number) here </answer>."
)


def build_module(options: argparse.Namespace) -> GRPOModule:
    """The policy (base model + LoRA), the two rewards, the GRPO settings and the optimizer."""
    return GRPOModule(
        options.model,
        [math_answer, FormatReward()],  # math_answer reads the "answer" column (GSM8K's "... #### 72")
        reward_weights=[1.0, 0.2],
        policy=PolicyConfig(
            lora_r=16,
            lora_alpha=32,
            target_modules="all-linear",
            dtype=options.dtype,
            gradient_checkpointing=options.gradient_checkpointing,
        ),
        grpo=GRPOConfig(
            sampling=SamplingConfig(
                num_generations=options.num_generations,
                max_prompt_length=options.max_prompt_length,
                max_new_tokens=options.max_new_tokens,
            ),
            update=UpdateConfig(micro_batch_size=options.micro_batch_size),
            objective=ObjectiveConfig(
                kl_coef=0.001, kl_estimator="k3", clip_low=0.2, clip_high=0.2, loss_agg_mode="token-mean"
            ),
            validation=ValidationConfig(temperature=0.6),
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0),
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LinearLR(optimizer, 0.1, total_iters=10),
    )


def build_data(options: argparse.Namespace) -> PromptDataModule:
    """GSM8K questions, in the tokenizer's chat template after the system prompt."""
    return PromptDataModule(
        options.train_data,
        val_data=options.val_data,
        hf_config=options.hf_config,
        prompt_field=options.prompt_field,
        chat_template=options.chat_template,
        system_prompt=SYSTEM_PROMPT,
        batch_size=options.batch_size,
        val_batch_size=64,
    )


def build_trainer(options: argparse.Namespace) -> Trainer:
    """One device; CSV metrics, the monitoring callbacks, periodic adapter exports and checkpoints."""
    validate = options.val_data is not None
    return Trainer(
        accelerator=options.accelerator,
        devices=1,
        precision="32-true",  # bf16 base weights come from PolicyConfig.dtype; the adapter stays fp32
        max_steps=options.max_steps,
        log_every_n_steps=1,
        val_check_interval=options.val_every if validate else None,
        check_val_every_n_epoch=None,
        limit_val_batches=4 if validate else 0,
        num_sanity_val_steps=0,
        default_root_dir=options.output_dir,
        logger=CSVLogger(options.output_dir, name="gsm8k_lora"),
        callbacks=[
            *default_callbacks(sample_every_n_iterations=25),
            AdapterExport(every_n_iterations=options.save_every),
            ModelCheckpoint(every_n_train_steps=options.save_every, save_last=True),
        ],
        enable_progress_bar=options.progress_bar,
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults are the GPU recipe."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = parser.add_argument
    add("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="HF id or local path")
    add("--train-data", default="hf:openai/gsm8k", help="hf:<name> or a JSONL/JSON path")
    add("--val-data", default="hf:openai/gsm8k@test", help="validation prompts; 'none' for no validation")
    add("--hf-config", default="main", help="configuration of an hf: dataset")
    add("--prompt-field", default="question")
    add("--no-chat-template", dest="chat_template", action="store_false", help="plain prompts (base models)")
    add("--max-steps", type=int, default=500, help="optimizer steps: GRPO iterations (one mini-batch each)")
    add("--num-generations", type=int, default=8, help="G, samples per question")
    add("--batch-size", type=int, default=16, help="questions per iteration")
    add("--max-prompt-length", type=int, default=512)
    add("--max-new-tokens", type=int, default=512)
    add("--micro-batch-size", type=int, default=16, help="completions per forward/backward")
    add("--lr", type=float, default=2e-5)
    add("--dtype", default="bfloat16", choices=["auto", "float32", "bfloat16", "float16"], help="base weights")
    add("--gradient-checkpointing", action="store_true")
    add("--accelerator", default="auto")
    add("--val-every", type=int, default=100, help="iterations between validations")
    add("--save-every", type=int, default=100, help="iterations (= optimizer steps) between exports, checkpoints")
    add("--output-dir", default="runs")
    add("--num-threads", type=int, default=None, help="CPU threads for PyTorch (1 suits tiny models)")
    add("--no-progress-bar", dest="progress_bar", action="store_false")
    options = parser.parse_args(argv)
    options.val_data = None if options.val_data in ("none", "") else options.val_data
    return options


def hub_sources(options: argparse.Namespace) -> list[str]:
    """What this run would fetch from the hub: the model unless it is a local folder, and each ``hf:`` dataset."""
    sources = [] if Path(options.model).expanduser().exists() else [f"model {options.model}"]
    for data in (options.train_data, options.val_data):
        if isinstance(data, str) and data.startswith("hf:"):
            sources.append(f"dataset {data[3:].split('@')[0]}")
    return list(dict.fromkeys(sources))  # train and validation splits of one dataset: named once


def check_hub(options: argparse.Namespace, timeout: float = 2.0) -> None:
    """Exit at once, saying what to download, when the run needs the hub and it does not answer within ``timeout``.

    Skipped with ``HF_HUB_OFFLINE=1`` (the loaders then read the local cache) and when everything is local.
    """
    sources = hub_sources(options)
    if not sources or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or hub_reachable(timeout):
        return
    model = options.model if f"model {options.model}" in sources else "Qwen/Qwen2.5-0.5B-Instruct"
    sys.exit(
        f"gsm8k_lora: the Hugging Face hub ({hub_endpoint()}) did not answer within {timeout:g} s and this run needs "
        f"{', '.join(sources)}. On a machine with network access, download once:\n"
        f"  hf download {model} --local-dir models/{Path(model).name}\n"
        "  python -c \"from datasets import load_dataset as d; [d('openai/gsm8k', 'main', split=s).to_json("
        "f'gsm8k-{s}.jsonl') for s in ('train', 'test')]\"\n"
        f"then run: python examples/gsm8k_lora.py --model models/{Path(model).name} --train-data gsm8k-train.jsonl "
        "--val-data gsm8k-test.jsonl\n"
        "If they are already in the Hugging Face cache, set HF_HUB_OFFLINE=1 instead (docs/first-run.md)."
    )


def main(argv: Sequence[str] | None = None) -> Trainer:
    """Train; returns the fitted trainer (its ``logger.log_dir`` holds metrics.csv and samples.csv)."""
    options = parse(argv)
    if any(str(source).startswith("hf:") for source in (options.train_data, options.val_data)):
        exit_unless_installed("gsm8k_lora", "data")
    check_hub(options)
    if options.num_threads:
        torch.set_num_threads(options.num_threads)
    trainer = build_trainer(options)
    trainer.fit(build_module(options), build_data(options))
    print(f"metrics: {trainer.logger.log_dir}/metrics.csv; adapter: {trainer.logger.log_dir}/adapter")
    return trainer


if __name__ == "__main__":
    main()
