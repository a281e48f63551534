"""Micro-measurements quoted in ``docs/benchmarks.md``: ``python -m benchmarks.micro NAME [--threads N]``.

``logits-to-keep``  peak memory of a no-grad forward with the logits of every position vs completion positions only.
``fused-head``      extra memory of the fused head's log-prob + loss (forward and backward) against the hidden states.
``logprob-paths``   peak memory and CPU seconds of one log-prob forward + backward, for each path combination.
``min-p``           CPU seconds of ``generate`` with ``min_p=0.0`` (a no-op warper) and ``min_p=None``.

Models are built from ``small-30m`` with random weights (:mod:`benchmarks.models`); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.measure import profiled_peak_bytes
from benchmarks.models import load_tokenizer, prepare_model
from benchmarks.workload import make_prompts

__all__ = ["main"]

MiB = 2**20


def _small(directory: Path) -> tuple[Path, object]:
    model_dir = prepare_model("small-30m", directory / "model")
    return model_dir, load_tokenizer(model_dir)


def logits_to_keep(directory: Path) -> None:
    """16 rows of 64 prompt + 64 completion tokens through ``small-30m``, without gradient."""
    from transformers import AutoModelForCausalLM

    model_dir, _ = _small(directory)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    n, p, t = 16, 64, 64
    ids = torch.randint(4, model.config.vocab_size, (n, p + t))
    for keep, label in ((0, "every position"), (t + 1, "completion positions (logits_to_keep=T+1)")):

        def block(keep: int = keep) -> None:
            with torch.no_grad():
                model(ids, logits_to_keep=keep)

        print(f"logits of {label}: peak {profiled_peak_bytes(block) / MiB:.1f} MiB")


def fused_head(directory: Path) -> None:
    """The fused head at the issue's shape (152k vocabulary, 1,024 tokens, width 896) and the test's scaled shape."""
    from lightning_grpo.algorithms import FusedHeadLogProbs

    shapes = [(151_936, 896, 1, 1024, torch.float32), (151_936, 896, 1, 1024, torch.bfloat16)]
    shapes.append((151_936 // 16, 448, 8, 256, torch.float32))
    for vocab, width, n, t, dtype in shapes:
        generator = torch.Generator().manual_seed(0)
        hidden = torch.randn(n, t, width, generator=generator).to(dtype).requires_grad_()
        weight = (torch.randn(vocab, width, generator=generator) / width**0.5).to(dtype)
        targets = torch.randint(vocab, (n, t), generator=generator)

        def block(hidden: torch.Tensor = hidden, weight: torch.Tensor = weight, ids: torch.Tensor = targets) -> None:
            logprobs, _ = FusedHeadLogProbs.apply(hidden, weight, None, ids, 0.7, 1024, True)
            (-logprobs.mean()).backward()

        extra = profiled_peak_bytes(block)
        print(
            f"V={vocab} H={width} {n}x{t} {dtype}: hidden {hidden.nbytes / MiB:.2f} MiB, extra {extra / MiB:.1f} MiB "
            f"= {extra / hidden.nbytes:.2f}x; bf16 logits would be {n * t * vocab * 2 / MiB:.0f} MiB"
        )


def logprob_paths(directory: Path) -> None:
    """One log-prob forward + backward of 4 prompts x 8 completions (P = T = 64) through the LoRA policy."""
    from lightning_grpo.policy import PolicyConfig, load_policy
    from lightning_grpo.rollout import SamplingSettings, completion_logprobs, generate_rollout

    model_dir, tokenizer = _small(directory)
    policy = load_policy(str(model_dir), PolicyConfig(lora_r=16, dtype="float32"))
    torch.manual_seed(0)
    settings = SamplingSettings(8, 64, min_new_tokens=64)
    rollout = generate_rollout(policy, tokenizer, make_prompts(tokenizer, 4, 64, 0), settings, max_prompt_length=64)
    policy.train()
    for share, fused in ((False, False), (True, False), (False, True), (True, True)):

        def block(share: bool = share, fused: bool = fused) -> None:
            out = completion_logprobs(policy, rollout, with_entropy=True, share_prompt=share, fused_head=fused)
            (out.logprobs * rollout.completion_mask).sum().backward()
            policy.zero_grad(set_to_none=True)

        start = time.process_time()
        block()
        seconds = time.process_time() - start
        peak = profiled_peak_bytes(block)
        print(f"share_prompt={share} fused_head={fused}: peak {peak / MiB:,.0f} MiB, {seconds:.2f} s CPU")


def min_p(directory: Path) -> None:
    """``generate`` on 16 prompts x 8 (P = 64) for 32 tokens, twice each way."""
    from lightning_grpo.policy import PolicyConfig, load_policy
    from lightning_grpo.rollout import SamplingSettings
    from lightning_grpo.rollout.generation import tokenize_prompts

    model_dir, tokenizer = _small(directory)
    policy = load_policy(str(model_dir), PolicyConfig(lora_r=16, dtype="float32")).eval()
    ids, mask = tokenize_prompts(tokenizer, make_prompts(tokenizer, 16, 64, 0), 64, torch.device("cpu"))
    seconds: dict[float | None, list[float]] = {0.0: [], None: []}
    with torch.no_grad():
        for _ in range(2):
            for value in seconds:
                config = SamplingSettings(8, 32, min_new_tokens=32).generation_config(tokenizer)
                config.min_p = value
                start = time.process_time()
                policy.generate(input_ids=ids, attention_mask=mask, generation_config=config)
                seconds[value].append(time.process_time() - start)
    for value, runs in seconds.items():
        print(f"min_p={value}: " + ", ".join(f"{s:.2f}" for s in runs) + " s CPU")


MEASUREMENTS: dict[str, Callable[[Path], None]] = {
    "logits-to-keep": logits_to_keep,
    "fused-head": fused_head,
    "logprob-paths": logprob_paths,
    "min-p": min_p,
}


def main(argv: list[str] | None = None) -> None:
    """Run one measurement and print its figures."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=list(MEASUREMENTS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="grpo-micro-") as tmp:
        MEASUREMENTS[args.name](Path(tmp))


if __name__ == "__main__":
    main()
