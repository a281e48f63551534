"""Where a GRPO step's time goes on a GPU: decode steps and one update micro-batch under ``torch.profiler``.

For each phase: wall seconds, the GPU's busy seconds (sum of kernel times), ATen calls, and the top operators by
self CPU and self CUDA time. A phase whose GPU busy time is far below its wall time is bound by the host (Python,
kernel launches, syncs), not by the GPU.

    python -m benchmarks.profile_step --model qwen2.5-0.5b --rows 256 --prompt-length 256 --decode-tokens 32
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.decode_paths import _policy
from benchmarks.models import PRESETS
from benchmarks.workload import make_prompts
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout.generation import generate_rollout
from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = ["main"]


def _report(name: str, prof: profile, wall: float, top: int) -> None:
    events = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6  # kernels only
    calls = sum(e.count for e in events if e.key.startswith("aten::"))
    print(f"== {name}: wall {wall:.3f}s, GPU busy {gpu:.3f}s ({gpu / wall:.0%}), ATen calls {calls}", flush=True)
    for key in ("self_cpu_time_total", "self_device_time_total"):
        print(events.table(sort_by=key, row_limit=top, max_name_column_width=48), flush=True)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed_profile(fn) -> tuple[profile, float]:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    fn()  # warm-up
    with profile(activities=activities) as prof:
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
    return prof, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Profile the decode and the update of one micro-batch; print the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=list(PRESETS))
    parser.add_argument("--rows", type=int, default=256, help="completions sampled at once (B*G)")
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy, tokenizer = _policy(args.model, torch.bfloat16, device)
    prompts = make_prompts(tokenizer, args.rows // args.G, args.prompt_length, seed=0)
    settings = SamplingSettings(args.G, args.decode_tokens, min_new_tokens=args.decode_tokens)
    for name, options in {"generate": {}, "own loop": {"drop_finished": True}}.items():
        chosen = replace(settings, **options)
        with torch.no_grad():
            prof, wall = _timed_profile(
                lambda s=chosen: generate_rollout(policy, tokenizer, prompts, s, max_prompt_length=args.prompt_length)
            )
        _report(f"decode {args.decode_tokens} tokens x {args.rows} rows, {name}", prof, wall, args.top)
    full = replace(settings, max_new_tokens=args.prompt_length, min_new_tokens=args.prompt_length)
    with torch.no_grad():
        micro = prompts[: max(args.micro_batch // args.G, 1)]
        rollout = generate_rollout(policy, tokenizer, micro, full, max_prompt_length=args.prompt_length)
    policy.train()

    def update() -> None:
        logprobs = completion_logprobs(policy, rollout).logprobs
        (logprobs * rollout.sampled_mask).sum().backward()

    prof, wall = _timed_profile(update)
    _report(
        f"update: forward+backward of {len(rollout)} x {args.prompt_length}+{args.prompt_length}", prof, wall, args.top
    )


if __name__ == "__main__":
    main()
