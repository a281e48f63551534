"""Decode paths side by side: seconds, tokens/s and fraction of the memory-bandwidth floor of each sampling path.

The policy is the benchmark model (random weights, built on the device in its dtype, no files) under a float32 LoRA
adapter, as :func:`lightning_grpo.policy.load_policy` builds it. Every path samples the same prompts with fixed-length
completions (EOS forbidden, ``min_new_tokens = max_new_tokens``), so each does the same work; the first call of each
path is a warm-up (compilation included, reported apart). The floor is :func:`benchmarks.measure.decode_floor_seconds`
(weights + KV cache read once per token at the measured copy bandwidth). The ``compiled`` paths are ``decode:
compiled`` (:class:`~lightning_grpo.rollout.compiled_decode.CompiledDecoder`, inductor, CUDA graphs on CUDA); their
"new length" call stays in the bucket, so it must not recompile. Each path's line is printed as it ends.

    python -m benchmarks.decode_paths --model qwen2.5-0.5b --prompts 32 --G 8 --prompt-length 256 \\
        --max-new-tokens 256 --json build/decode.json
    python -m benchmarks.decode_paths --model small-30m --prompts 2 --G 2 --prompt-length 16 --max-new-tokens 8
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2ForCausalLM

from benchmarks.measure import decode_floor_seconds, device_limits
from benchmarks.models import PRESETS, build_word_tokenizer, param_counts
from benchmarks.workload import make_prompts
from lightning_grpo import PolicyConfig
from lightning_grpo.policy import load_policy
from lightning_grpo.policy.sampling_adapter import sampling_adapter
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.rollout.generation import sample_tokens, tokenize_prompts
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings

__all__ = ["PATHS", "main", "time_path"]

#: name -> (SamplingSettings overrides, sampling adapter mode)
PATHS: dict[str, tuple[dict[str, Any], str]] = {
    "generate": ({}, "as_trained"),
    "own loop (inverse_cdf)": ({"sampler": "inverse_cdf"}, "as_trained"),
    "own loop (multinomial, drop finished)": ({"drop_finished": True}, "as_trained"),
    "generate, merged adapter": ({}, "merged"),
    "generate, static cache": ({"static_cache": True}, "as_trained"),  # compiled: the slow starts last
    "generate, static cache, merged adapter": ({"static_cache": True}, "merged"),
    "compiled (multinomial)": ({"decode": "compiled"}, "as_trained"),  # decode: compiled (CompiledDecoder)
    "compiled (inverse_cdf)": ({"decode": "compiled", "sampler": "inverse_cdf"}, "as_trained"),
    "compiled (inverse_cdf), merged adapter": ({"decode": "compiled", "sampler": "inverse_cdf"}, "merged"),
}


def _policy(name: str, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
    """The preset's model built on ``device`` in ``dtype`` under a float32 LoRA r=16 adapter, and its tokenizer."""
    with torch.device(device):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(PRESETS[name].config()).to(dtype)
    policy = load_policy(model, PolicyConfig(lora_r=16, lora_alpha=32))
    return policy.eval(), build_word_tokenizer(PRESETS[name].vocab_size)


def time_path(
    policy: Any,
    tokenizer: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    settings: SamplingSettings,
    mode: str,
    sample: Callable[..., Any] = sample_tokens,
) -> float:
    """Seconds of one sampling call by ``sample`` (CUDA synchronised on both ends)."""
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad(), sampling_adapter(policy, mode):
        sampled = sample(policy, tokenizer, SampleRequest(ids, mask, settings))
    if ids.is_cuda:
        torch.cuda.synchronize()
    assert sampled.sequences.shape[1] == ids.shape[1] + settings.max_new_tokens
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time every path in :data:`PATHS` (or ``--paths``); print a table; write ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode_paths", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=list(PRESETS))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--paths", nargs="*", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    policy, tokenizer = _policy(args.model, dtype, args.device)
    prompts = make_prompts(tokenizer, args.prompts, args.prompt_length, seed=0)
    shorter = make_prompts(tokenizer, args.prompts, args.prompt_length - 8, seed=1)
    ids, mask = tokenize_prompts(tokenizer, prompts, args.prompt_length, torch.device(args.device))
    ids2, mask2 = tokenize_prompts(tokenizer, shorter, args.prompt_length, torch.device(args.device))
    limits = device_limits(args.device, dtype)
    rows, tokens = args.prompts * args.G, args.prompts * args.G * args.max_new_tokens
    counts = param_counts(PRESETS[args.model].config())
    floor = decode_floor_seconds(
        counts,
        rows,
        args.prompt_length,
        args.max_new_tokens,
        torch.finfo(dtype).bits // 8,
        limits["bandwidth_bytes_per_s"],
    )
    base = SamplingSettings(args.G, args.max_new_tokens, min_new_tokens=args.max_new_tokens)
    results: dict[str, Any] = {}
    buckets = DecodeBuckets.for_run(None, max_prompt_length=args.prompt_length, max_new_tokens=args.max_new_tokens)
    for name in args.paths:
        overrides, mode = dict(PATHS[name][0]), PATHS[name][1]
        sample = CompiledDecoder(buckets).sample if overrides.pop("decode", None) == "compiled" else sample_tokens
        settings = replace(base, **overrides)
        first = time_path(policy, tokenizer, ids, mask, settings, mode, sample)
        times = [time_path(policy, tokenizer, ids, mask, settings, mode, sample) for _ in range(args.repeats)]
        other_length = time_path(policy, tokenizer, ids2, mask2, settings, mode, sample)  # a new shape: recompiles?
        best = min(times)
        results[name] = {
            "first_seconds": first,
            "seconds": times,
            "new_prompt_length_seconds": other_length,
            "tokens_per_s": tokens / best,
            "floor_fraction": floor / best,
        }
        print(
            f"{name:42s} first {first:7.2f}s  best {best:7.3f}s  {tokens / best:10.0f} tok/s  "
            f"floor {floor / best:6.1%}  new length {other_length:7.2f}s",
            flush=True,
        )
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "limits": limits,
        "floor_seconds": floor,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "paths": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
