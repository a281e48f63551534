"""The importance ratio of truncated sampling before and after issue 65: the sampler's kept-set log-probs against the
trainer's full-vocabulary ones (before), and against the trainer's log-probs on the replayed kept set (after).

For each rollout backend (``hf``: ``generate``; ``vllm``: the colocated engine; ``vllm_server``: a started server)
and each setting, ``--prompts`` prompts x G ``--generations`` samples of up to ``--new-tokens`` tokens are drawn from
the tiny test policy (vocabulary 100, output head doubled for sharper distributions, a random LoRA adapter), then the
trainer's forward of the same weights (fused head) gives its log-probs and kept log mass. Reported over every
sampled token: the raw ratio ``exp(log π - log μ)``'s mean, median and share outside [0.9, 1.1], before and after.
vLLM on CPU needs a ``top_k`` with ``top_p`` (docs/vllm.md): the top-p row sets ``top_k`` to the vocabulary size,
which cuts nothing itself.

    OMP_NUM_THREADS=1 python -m benchmarks.truncated_ratio                     # hf, vllm, vllm_server
    OMP_NUM_THREADS=1 python -m benchmarks.truncated_ratio --backends hf vllm
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

from lightning_grpo.algorithms.importance import lifted_behaviour
from lightning_grpo.rollout.generation import generate_rollout
from lightning_grpo.rollout.logprobs import completion_logprobs
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

__all__ = ["main", "ratio_stats"]

SETTINGS = {"top_p 0.8": {"top_p": 0.8, "top_k": 100}, "top_p 1.0": {}}


def ratio_stats(log_ratio: torch.Tensor) -> dict[str, float]:
    """Mean, median and share outside [0.9, 1.1] of ``exp(log_ratio)`` (1-D, float64)."""
    ratio = log_ratio.double().exp()
    return {
        "mean": float(ratio.mean()),
        "median": float(ratio.median()),
        "outside": float(((ratio < 0.9) | (ratio > 1.1)).double().mean()),
    }


def _base() -> Any:
    model = build_tiny_model(build_tiny_tokenizer(), num_heads=2, num_kv_heads=1, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    return model


def _policy() -> Any:
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(_base(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    return policy.eval()


@contextlib.contextmanager
def _sampler(backend: str, policy: Any, settings: SamplingSettings, folder: str) -> Iterator[Any]:
    """The ``SampleFn`` of ``backend`` with the policy's weights synced (``None``: ``generate``)."""
    if backend == "hf":
        yield None
    elif backend == "vllm":
        from lightning_grpo.backends.vllm.engine import VLLMEngine
        from lightning_grpo.backends.vllm.settings import VLLMConfig

        engine = VLLMEngine.start(
            policy, VLLMConfig(), model_name=None, max_model_len=96, max_lora_rank=8, seed=0, max_logprobs=100
        )
        engine.sync(policy, 0)
        try:
            yield engine.sample
        finally:
            engine.close()
    else:
        yield from _server(policy, settings, folder)


def _server(policy: Any, settings: SamplingSettings, folder: str) -> Iterator[Any]:
    from lightning_grpo import GRPOConfig, PolicyConfig
    from lightning_grpo.backends import BackendSpec, VLLMServerBackend, VLLMServerConfig
    from lightning_grpo.config import SamplingConfig

    model = _base()
    model.config.architectures = ["Qwen2ForCausalLM"]
    model.save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    sampling = SamplingConfig(max_prompt_length=32, max_new_tokens=settings.max_new_tokens, top_k=100)
    spec = BackendSpec(GRPOConfig(sampling=sampling), PolicyConfig(lora_r=4), folder)
    backend = VLLMServerBackend(VLLMServerConfig(start=True, cpu_threads=1, max_lora_rank=8, max_model_len=96), spec)
    backend.start(policy, seed=0, sharded=False)
    backend.sync(policy, 0)
    session = backend.session(policy, settings)
    try:
        yield session.sample
    finally:
        session.close()
        backend.close()


def measure(backend: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One row: the before and after statistics of ``backend`` under the setting ``name``."""
    policy, tokenizer = _policy(), build_tiny_tokenizer()
    settings = SamplingSettings(args.generations, args.new_tokens, temperature=args.temperature, **SETTINGS[name])
    prompts = [f"{i}+{i + 3}=" for i in range(args.prompts)]
    with tempfile.TemporaryDirectory() as folder, _sampler(backend, policy, settings, folder) as sample:
        torch.manual_seed(0)
        rollout = generate_rollout(policy, tokenizer, prompts, settings, max_prompt_length=32, sample=sample)
    with torch.no_grad():
        found = completion_logprobs(policy, rollout, temperature=args.temperature)
    real = rollout.completion_mask.bool()
    before = (found.logprobs - rollout.logprobs)[real]
    after = (found.logprobs - lifted_behaviour(rollout.logprobs, found.kept_log_mass))[real]
    stats = {"before": ratio_stats(before), "after": ratio_stats(after)}
    return {"backend": backend, "setting": name, "tokens": int(real.sum()), **stats}


def _cell(stats: dict[str, float]) -> str:
    return f"{stats['mean']:.4f} / {stats['median']:.4f} / {100 * stats['outside']:.1f}%"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm", "vllm_server"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    print(
        "| backend | setting | tokens | before: mean / median / outside [0.9, 1.1] | after: mean / median / outside |"
    )
    print("| --- | --- | --- | --- | --- |")
    for backend in args.backends:
        for name in SETTINGS:
            row = measure(backend, name, args)
            cells = [_cell(row[side]) for side in ("before", "after")]
            print(f"| {backend} | {name} | {row['tokens']} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
