"""Padded vs packed log-prob and update passes on variable-length completions (issue 36).

``python -m benchmarks.packing --prompts 2 --G 8 --min-len 8 --max-len 256 --repeats 3 --threads 1``

``--length-dist lognormal`` draws the lengths as ``benchmarks.run --workload uneven`` scripts them
(:func:`benchmarks.uneven.draw_lengths`: lognormal of median ``--length-median`` and log-deviation ``--length-sigma``,
clipped to ``[--min-len, --max-len]``, the longest set to ``--max-len``; issue 55).

A rollout of ``prompts × G`` rows: prompts of ``--prompt-length`` tokens, completion lengths drawn once from a seeded
uniform distribution over ``[--min-len, --max-len]`` (the same lengths on every run and every side). Four layouts of
the same passes, run round-robin (so that load on a shared machine hits all of them alike): padded rows with the
shared prompt's KV cache (the default before packing), padded rows, packed rows, packed rows with each prompt once.
For each: the update pass (forward + backward of every micro-batch, fused head, entropy) and the no-grad log-prob
pass, in wall and CPU seconds (medians and ranges), the tokens each forward processes (padding included) and the
peak bytes of tensors in one update pass (PyTorch's memory profiler).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.measure import median, profiled_peak_bytes
from benchmarks.models import load_tokenizer, prepare_model
from benchmarks.uneven import draw_lengths, format_summary, length_summary
from lightning_grpo.rollout import Rollout, completion_logprobs

__all__ = ["main", "scripted_rollout"]

MiB = 2**20
LAYOUTS = {  # name: (share_prompt, packing)
    "padded, shared prompt (KV cache)": (True, False),
    "padded": (False, False),
    "packed": (False, True),
    "packed, shared prompt (4-D mask)": (True, True),
}


def scripted_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    """``n`` completion lengths, uniform over ``[low, high]``, from ``seed`` (the same on every side)."""
    return torch.randint(low, high + 1, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def scripted_rollout(vocab: int, prompts: int, g: int, prompt_length: int, lengths: list[int], seed: int) -> Rollout:
    """``prompts × g`` rows: random prompt tokens, completions of ``lengths`` tokens, right-padded."""
    gen = torch.Generator().manual_seed(seed)
    n, t = prompts * g, max(lengths)
    prompt_ids = torch.randint(4, vocab, (prompts, prompt_length), generator=gen).repeat_interleave(g, 0)
    completion_mask = (torch.arange(t)[None] < torch.tensor(lengths)[:, None]).long()
    completion_ids = torch.randint(4, vocab, (n, t), generator=gen) * completion_mask
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.arange(prompts).repeat_interleave(g),
        prompts=[""] * n,
        completions=[""] * n,
    )


def processed_tokens(rollout: Rollout, micro: int, share_prompt: bool, packing: bool) -> int:
    """Positions the forwards process, padding included, over micro-batches of ``micro`` rows."""
    total = 0
    for rows in torch.arange(len(rollout)).split(micro):
        part = rollout.select(rows)
        p, t, lengths = part.prompt_ids.shape[1], part.completion_ids.shape[1], part.completion_lengths
        prompts = len(torch.unique(part.prompt_ids, dim=0)) if share_prompt else len(part)
        if packing:
            total += prompts * p + int((lengths - 1).clamp(min=0).sum())
        else:
            total += (prompts * (p - 1) + len(part) * t) if share_prompt else len(part) * (p + t)
    return total


def _update_pass(policy: torch.nn.Module, rollout: Rollout, micro: int, share: bool, packing: bool) -> None:
    for rows in torch.arange(len(rollout)).split(micro):
        part = rollout.select(rows)
        out = completion_logprobs(policy, part, with_entropy=True, share_prompt=share, packing=packing)
        ((out.logprobs + 0.01 * out.entropy) * part.completion_mask).sum().backward()
    policy.zero_grad(set_to_none=True)


def _logprob_pass(policy: torch.nn.Module, rollout: Rollout, micro: int, share: bool, packing: bool) -> None:
    with torch.no_grad():
        for rows in torch.arange(len(rollout)).split(micro):
            completion_logprobs(policy, rollout.select(rows), share_prompt=share, packing=packing)


def _timed(fn, *args) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def run(args: argparse.Namespace) -> dict:
    """Measure every layout; return the JSON-able results."""
    from lightning_grpo.policy import PolicyConfig, load_policy

    torch.set_num_threads(args.threads)
    model_dir = prepare_model(args.model, Path(args.model_dir))
    vocab = len(load_tokenizer(model_dir))
    policy = load_policy(str(model_dir), PolicyConfig(lora_r=16, dtype="float32"))
    n = args.prompts * args.G
    if args.length_dist == "lognormal":
        lengths = draw_lengths(n, args.min_len, args.max_len, args.length_median, args.length_sigma, args.seed)
    else:
        lengths = scripted_lengths(n, args.min_len, args.max_len, args.seed)
    print(f"completion lengths: {format_summary(length_summary(lengths))}", flush=True)
    rollout = scripted_rollout(vocab, args.prompts, args.G, args.prompt_length, lengths, args.seed)
    rollout = rollout.select(torch.randperm(len(rollout), generator=torch.Generator().manual_seed(args.seed)))
    micro = args.micro_batch_size or len(rollout)
    results = {name: {"update": [], "logprobs": []} for name in LAYOUTS}
    policy.train()
    for _ in range(args.repeats + 1):  # round-robin; the first round is warm-up
        for name, (share, packing) in LAYOUTS.items():
            results[name]["update"].append(_timed(_update_pass, policy, rollout, micro, share, packing))
            results[name]["logprobs"].append(_timed(_logprob_pass, policy, rollout, micro, share, packing))
    real = int(rollout.prompt_mask.sum() + rollout.completion_mask.sum())
    out = {"args": vars(args), "real_tokens": real, "lengths": lengths, "layouts": {}}
    out["length_summary"] = length_summary(lengths)
    for name, (share, packing) in LAYOUTS.items():
        peak = profiled_peak_bytes(lambda s=share, p=packing: _update_pass(policy, rollout, micro, s, p))
        entry = {"tokens": processed_tokens(rollout, micro, share, packing), "peak_update_bytes": peak}
        for phase in ("update", "logprobs"):
            runs = results[name][phase][1:]
            for kind, i in (("wall", 0), ("cpu", 1)):
                values = [r[i] for r in runs]
                entry[f"{phase}_{kind}"] = {"median": median(values), "min": min(values), "max": max(values)}
        out["layouts"][name] = entry
    return out


def print_table(result: dict) -> None:
    """Markdown table of :func:`run`'s result."""
    base = result["layouts"]["padded"]
    print(f"real tokens (prompt + completion): {result['real_tokens']:,}")
    print(
        "| layout | tokens processed | update s wall (range); vs padded | update s CPU | log-prob s wall (range); vs "
        "padded | peak MiB (update) |"
    )
    print("|---|---|---|---|---|---|")
    for name, e in result["layouts"].items():
        u, c, lp = e["update_wall"], e["update_cpu"], e["logprobs_wall"]
        print(
            f"| {name} | {e['tokens']:,} | {u['median']:.2f} ({u['min']:.2f}-{u['max']:.2f}); "
            f"{u['median'] / base['update_wall']['median']:.2f}x | {c['median']:.2f} | {lp['median']:.2f} "
            f"({lp['min']:.2f}-{lp['max']:.2f}); {lp['median'] / base['logprobs_wall']['median']:.2f}x | "
            f"{e['peak_update_bytes'] / MiB:,.0f} |"
        )


def main(argv: list[str] | None = None) -> None:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-30m")
    parser.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "bench-packing-model"))
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--length-dist", choices=["uniform", "lognormal"], default="uniform")
    parser.add_argument("--length-median", type=float, default=64.0)
    parser.add_argument("--length-sigma", type=float, default=1.0)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
