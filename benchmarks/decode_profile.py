"""Where a CPU decode's time goes: self CPU time by ``aten::`` operator, eager loop against the compiled path.

    python -m benchmarks.decode_profile --model small-30m --prompts 16 --G 8 --prompt-length 64 --max-new-tokens 64

One warmed sampling call of each path under ``torch.profiler`` (CPU activities); prints each path's wall seconds and
its top operators by self CPU time, grouped: matrix products (``mm``/``addmm``/``bmm``/``linear``, mkldnn and
inductor's external calls), attention (``scaled_dot_product_attention`` and its kernels), the draw
(``exponential_``/``uniform_``/``multinomial``/``sort``/``cumsum``/``argmax``), compiled code (inductor's
kernels), everything else.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.compiled_decode import _eager_loop, _policy
from benchmarks.models import PRESETS
from benchmarks.workload import make_prompts
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.rollout.generation import tokenize_prompts
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings

__all__ = ["main"]

GROUPS = {
    "matmul": ("mm", "addmm", "bmm", "linear", "mkldnn", "matmul", "_mkl", "extern"),
    "attention": ("attention", "sdpa", "_flash", "softmax"),
    "draw": ("exponential", "uniform", "multinomial", "sort", "cumsum", "argmax", "searchsorted", "topk"),
    "compiled kernels": ("cpp_fused", "CompiledFunction", "Torch-Compiled", "kernel"),
}


def _group(name: str) -> str:
    lowered = name.lower()
    for group, keys in GROUPS.items():
        if any(key.lower() in lowered for key in keys):
            return group
    return "other"


def _profile_call(sample, policy, tokenizer, ids, mask, settings) -> tuple[float, dict[str, float], list]:
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        sample(policy, tokenizer, SampleRequest(ids, mask, settings))
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    groups: dict[str, float] = {}
    for event in events:
        groups[_group(event.key)] = groups.get(_group(event.key), 0.0) + event.self_cpu_time_total / 1e6
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return wall, groups, [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in top]


def main(argv: list[str] | None = None) -> None:
    """Profile one warmed call of the eager loop and of the compiled path; print the split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="small-30m")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sampler", choices=["multinomial", "inverse_cdf"], default="inverse_cdf")
    args = parser.parse_args(argv)
    preset = PRESETS[args.model] if args.layers is None else replace(PRESETS[args.model], num_layers=args.layers)
    policy, tokenizer = _policy(preset, torch.float32, "cpu")
    prompts = make_prompts(tokenizer, args.prompts, args.prompt_length, seed=0)
    ids, mask = tokenize_prompts(tokenizer, prompts, args.prompt_length, torch.device("cpu"))
    n = args.max_new_tokens
    settings = SamplingSettings(args.G, n, min_new_tokens=n, sampler=args.sampler)
    buckets = DecodeBuckets.for_run(None, max_prompt_length=args.prompt_length, max_new_tokens=n)
    paths = {"eager loop": _eager_loop, "compiled": CompiledDecoder(buckets).sample}
    for name, sample in paths.items():
        with torch.no_grad():
            sample(policy, tokenizer, SampleRequest(ids, mask, settings))  # warm-up (the compile)
        wall, groups, top = _profile_call(sample, policy, tokenizer, ids, mask, settings)
        split = ", ".join(f"{group} {seconds:.2f}s" for group, seconds in sorted(groups.items(), key=lambda x: -x[1]))
        print(f"{name}: wall {wall:.2f}s (profiled); self CPU by group: {split}", flush=True)
        for key, seconds, count in top:
            print(f"    {key[:60]:60s} {seconds:7.3f}s  x{count}", flush=True)


if __name__ == "__main__":
    main()
