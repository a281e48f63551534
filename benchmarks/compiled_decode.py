"""The compiled decode path against its eager counterpart, side by side in one run (issue 50, item 4).

For each sampler (``multinomial``, ``inverse_cdf``) and each sampling adapter mode asked for, three figures per path:

* **tokens/s** of a warmed call: the eager loop (:func:`~lightning_grpo.rollout.decode.decode_loop`, the same
  draws as the compiled path) and, for ``multinomial``, ``generate`` (the default route), against the compiled path
  (:class:`~lightning_grpo.rollout.compiled_decode.CompiledDecoder`, inductor);
* the **compile time** apart (first call minus a warmed one) and the call amortised over a ``--run-steps`` run
  (one rollout per step: ``warmed + compile / run_steps``);
* the distance from the **matmul floor**: the decode's FLOPs (``2 · (N_body + N_head)`` per token, plus attention
  ``4 · layers · heads · head_dim`` per token and position read) at the measured matmul peak, over the warmed seconds.

Then ``aten::`` events per warmed decode step from ``torch.profiler`` (eager loop against compiled), at the preset's
shape with ``--profile-layers`` decoder layers: the events of a call with ``k + 1`` new tokens minus those of a call
with one, over ``k`` (prefill and the first draw cancel). A ``TorchDispatchMode`` (``DispatchCounter``) would make
dynamo skip the compiled code, so the profiler counts them. Each figure is printed as it ends.

    python -m benchmarks.compiled_decode --model qwen2.5-0.5b --layers 2 --prompts 16 --G 8 --prompt-length 128 \\
        --max-new-tokens 128 --json build/compiled_decode.json
    python -m benchmarks.compiled_decode --model small-30m --prompts 2 --G 2 --prompt-length 12 --max-new-tokens 4 \\
        --profile-tokens 2 --profile-layers 1   # a dry run
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen2ForCausalLM

from benchmarks.decode_paths import time_path
from benchmarks.measure import device_limits
from benchmarks.models import PRESETS, ModelPreset, ParamCounts, build_word_tokenizer, param_counts
from benchmarks.workload import make_prompts
from lightning_grpo import PolicyConfig
from lightning_grpo.policy import load_policy
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.rollout.decode import decode_loop
from lightning_grpo.rollout.generation import sample_tokens, tokenize_prompts
from lightning_grpo.rollout.sampling_settings import SampleRequest, SamplingSettings, eos_token_ids

__all__ = ["decode_flops", "main", "step_events"]

#: A sampling call: ``(policy, tokenizer, ids, mask, settings) -> Sampled``.
Sample = Callable[..., Any]


def _policy(preset: ModelPreset, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
    """The preset's model on ``device`` in ``dtype`` under a float32 LoRA r=16 adapter (``load_policy``'s)."""
    with torch.device(device):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(preset.config()).to(dtype)
    policy = load_policy(model, PolicyConfig(lora_r=16, lora_alpha=32))
    return policy.eval(), build_word_tokenizer(preset.vocab_size)


def decode_flops(counts: ParamCounts, heads: int, rows: int, prompt_length: int, new_tokens: int) -> float:
    """FLOPs of ``new_tokens`` decode steps of ``rows`` rows: the weights' matmuls and attention over the cache."""
    weights = 2.0 * (counts.body + counts.head) * rows * new_tokens
    positions = sum(prompt_length + t for t in range(new_tokens))
    return weights + 4.0 * counts.layers * heads * counts.head_dim * rows * positions


def _eager_loop(policy: Any, tokenizer: Any, request: SampleRequest) -> Any:
    ids, mask, s = request.prompt_ids, request.prompt_mask, request.settings
    return decode_loop(policy, ids, mask, s, eos_token_ids(tokenizer), tokenizer.pad_token_id)


def _paths(sampler: str, decoder: CompiledDecoder) -> dict[str, Sample]:
    paths: dict[str, Sample] = {"eager loop": _eager_loop, "compiled": decoder.sample}
    if sampler == "multinomial":
        paths = {"generate": sample_tokens, **paths}
    return paths


def _time_pair(
    args: argparse.Namespace,
    policy: Any,
    tokenizer: Any,
    batch: tuple[torch.Tensor, torch.Tensor],
    sampler: str,
    mode: str,
    floor: float,
) -> dict[str, Any]:
    """Every path of one sampler and adapter mode: first call, warmed calls, tokens/s, floor fraction, amortised."""
    ids, mask = batch
    settings = SamplingSettings(args.G, args.max_new_tokens, min_new_tokens=args.max_new_tokens, sampler=sampler)
    buckets = DecodeBuckets.for_run(None, max_prompt_length=args.prompt_length, max_new_tokens=args.max_new_tokens)
    decoder = CompiledDecoder(buckets, backend=args.backend)
    tokens = len(ids) * args.G * args.max_new_tokens
    results: dict[str, Any] = {}
    for name, sample in _paths(sampler, decoder).items():
        torch.manual_seed(0)
        first = time_path(policy, tokenizer, ids, mask, settings, mode, sample)
        warm = min(time_path(policy, tokenizer, ids, mask, settings, mode, sample) for _ in range(args.repeats))
        compile_s = max(first - warm, 0.0)
        amortised = warm + compile_s / args.run_steps
        results[name] = {
            "first_seconds": first,
            "seconds": warm,
            "compile_seconds": compile_s,
            "amortised_seconds": amortised,
            "tokens_per_s": tokens / warm,
            "amortised_tokens_per_s": tokens / amortised,
            "matmul_floor_fraction": floor / warm,
        }
        print(
            f"{sampler:11s} {mode:10s} {name:10s} {tokens / warm:10.0f} tok/s  warmed {warm:8.3f}s  "
            f"compile {compile_s:7.2f}s  amortised/{args.run_steps} {tokens / amortised:10.0f} tok/s  "
            f"matmul floor {floor / warm:6.1%}",
            flush=True,
        )
    eager = results["eager loop"]
    results["speedup_vs_eager"] = eager["seconds"] / results["compiled"]["seconds"]
    results["amortised_speedup_vs_eager"] = eager["seconds"] / results["compiled"]["amortised_seconds"]
    print(
        f"{sampler:11s} {mode:10s} compiled / eager loop: {results['speedup_vs_eager']:.2f}x warmed, "
        f"{results['amortised_speedup_vs_eager']:.2f}x amortised (target >= 1.3x)",
        flush=True,
    )
    return results


def _aten_events(
    sample: Sample, policy: Any, tokenizer: Any, batch: tuple[torch.Tensor, torch.Tensor], settings: SamplingSettings
) -> int:
    """``aten::`` events ``torch.profiler`` records over one sampling call."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        sample(policy, tokenizer, SampleRequest(*batch, settings))
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


def step_events(
    sample: Sample, policy: Any, tokenizer: Any, batch: tuple[torch.Tensor, torch.Tensor], g: int, steps: int
) -> float:
    """``aten::`` events per warmed decode step: (events with ``steps + 1`` new tokens − with 1) / ``steps``."""
    long = SamplingSettings(g, steps + 1, min_new_tokens=steps + 1)
    short = replace(long, max_new_tokens=1, min_new_tokens=1)
    for settings in (long, short):  # warm up (compiles)
        sample(policy, tokenizer, SampleRequest(*batch, settings))
    long_events = _aten_events(sample, policy, tokenizer, batch, long)
    short_events = _aten_events(sample, policy, tokenizer, batch, short)
    return (long_events - short_events) / steps


def _profile(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, float]:
    """``aten::`` events per decode step, eager loop against compiled, at ``--profile-layers`` layers."""
    preset = replace(PRESETS[args.model], num_layers=args.profile_layers)
    policy, tokenizer = _policy(preset, dtype, args.device)
    prompts = make_prompts(tokenizer, 2, args.prompt_length, seed=0)
    batch = tokenize_prompts(tokenizer, prompts, args.prompt_length, torch.device(args.device))
    buckets = DecodeBuckets.for_run(None, max_prompt_length=args.prompt_length, max_new_tokens=args.profile_tokens + 1)
    decoder = CompiledDecoder(buckets, backend=args.backend)
    counts = {}
    for name, sample in (("eager loop", _eager_loop), ("compiled", decoder.sample)):
        counts[name] = step_events(sample, policy, tokenizer, batch, 2, args.profile_tokens)
        print(f"aten:: events per decode step, {args.profile_layers} layers, {name}: {counts[name]:.0f}", flush=True)
    ratio = counts["compiled"] / max(counts["eager loop"], 1.0)
    print(f"aten:: events per step, compiled / eager loop: {ratio:.3f} (target <= 0.2)", flush=True)
    return {**counts, "ratio": ratio}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compiled_decode", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=list(PRESETS))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="warmed calls per path (the fastest counts)")
    parser.add_argument("--run-steps", type=int, default=100, help="the run the compile time is amortised over")
    parser.add_argument("--samplers", nargs="*", default=["multinomial", "inverse_cdf"])
    parser.add_argument("--adapters", nargs="*", default=["as_trained"], choices=["as_trained", "base_dtype", "merged"])
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled path")
    parser.add_argument("--profile-layers", type=int, default=2, help="layers of the aten:: count (0: skip it)")
    parser.add_argument("--profile-tokens", type=int, default=8, help="decode steps the aten:: count spans")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time the compiled path against the eager ones for each sampler and adapter mode; count ``aten::`` events."""
    args = _parser().parse_args(argv)
    dtype = getattr(torch, args.dtype)
    preset = PRESETS[args.model] if args.layers is None else replace(PRESETS[args.model], num_layers=args.layers)
    policy, tokenizer = _policy(preset, dtype, args.device)
    prompts = make_prompts(tokenizer, args.prompts, args.prompt_length, seed=0)
    batch = tokenize_prompts(tokenizer, prompts, args.prompt_length, torch.device(args.device))
    limits = device_limits(args.device, dtype)
    flops = decode_flops(
        param_counts(preset.config()), preset.num_heads, args.prompts * args.G, args.prompt_length, args.max_new_tokens
    )
    floor = flops / limits["matmul_flops_per_s"]
    print(
        f"decode FLOPs {flops:.3e}; matmul peak {limits['matmul_flops_per_s']:.3e} FLOP/s "
        f"({limits['matmul_dtype']}); floor {floor:.3f}s",
        flush=True,
    )
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "limits": limits,
        "decode_flops": flops,
        "matmul_floor_seconds": floor,
        "paths": {},
    }
    for sampler in args.samplers:
        for mode in args.adapters:
            report["paths"][f"{sampler}, {mode}"] = _time_pair(args, policy, tokenizer, batch, sampler, mode, floor)
    if args.profile_layers:
        report["aten_events_per_step"] = _profile(args, dtype)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
