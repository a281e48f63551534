"""Micro-measurements quoted in ``docs/benchmarks.md``: ``python -m benchmarks.micro NAME [--threads N]``.

``logits-to-keep``  peak memory of a no-grad forward with the logits of every position vs completion positions only.
``fused-head``      extra memory of the fused head's log-prob + loss (forward and backward) against the hidden states.
``logprob-paths``   peak memory and CPU seconds of one log-prob forward + backward, for each path combination.
``min-p``           CPU seconds of ``generate`` with ``min_p=0.0`` (a no-op warper) and ``min_p=None``.
``saved-activations``  bytes a token saves for backward per decoder layer (LoRA on every linear layer), fitted.
``qlora-export``    an adapter trained on an NF4 base, run on the full-precision base it is exported to.

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


def _saved_bytes(shape: tuple[int, int, int, int], layers: int, dtype: str, quantization: str | None) -> float:
    """Bytes saved for backward (distinct storages, parameters excluded) per token by one forward of the policy."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lightning_grpo.policy import PolicyConfig, load_policy

    h, inter, heads, kv = shape
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    policy = load_policy(Qwen2ForCausalLM(config), PolicyConfig(lora_r=16, dtype=dtype, quantization=quantization))
    owned = {t.untyped_storage().data_ptr() for t in [*policy.parameters(), *policy.buffers()]}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in owned:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(4, 1000, (4, 32))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        policy.train()(input_ids=ids, use_cache=False, logits_to_keep=1)
    return sum(saved.values()) / ids.numel()


def saved_activations(directory: Path) -> None:
    """Per-layer bytes (4 layers minus 2, halved) on six Qwen2 shapes, fitted as ``a·h + b·I + c·kvd + d``."""
    shapes = [(128, 512, 4, 2), (256, 512, 4, 2), (128, 1024, 4, 2), (128, 512, 4, 4), (256, 1024, 8, 2)]
    shapes.append((192, 768, 6, 2))
    for dtype, quantization in (("float32", None), ("bfloat16", None), ("bfloat16", "nf4")):
        rows, per_layer = [], []
        for h, inter, heads, kv in shapes:
            four, two = (_saved_bytes((h, inter, heads, kv), n, dtype, quantization) for n in (4, 2))
            rows.append([h, inter, kv * h // heads, 1])
            per_layer.append((four - two) / 2)
        fit = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64), torch.tensor(per_layer)[:, None].double())
        residual = (torch.tensor(rows, dtype=torch.float64) @ fit.solution).squeeze(1) - torch.tensor(per_layer)
        a, b, c, d = fit.solution.squeeze(1).tolist()
        measured = [round(x) for x in per_layer]
        print(
            f"{dtype} {quantization}: {a:.2f} h + {b:.2f} I + {c:.2f} kvd + {d:.0f} bytes per token and layer "
            f"(largest residual {residual.abs().max():.0f} bytes; measured {measured})"
        )


def qlora_export(directory: Path) -> None:
    """The warmed-up tiny ``addition`` model: an adapter (seeded random, B off zero) on its NF4 base, exported and
    loaded onto the float32 base; log-prob differences of the answer tokens, against NF4's own error without adapter."""
    from peft import PeftModel

    from lightning_grpo.policy import PolicyConfig, export_adapter, load_policy
    from lightning_grpo.testing import build_tiny_tokenizer, load_tiny_model

    tokenizer = build_tiny_tokenizer()
    policy = load_policy(load_tiny_model("addition"), PolicyConfig(lora_r=8, quantization="nf4", dtype="float32"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in policy.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    path = export_adapter(policy, directory / "adapter")
    merged = PeftModel.from_pretrained(load_tiny_model("addition"), str(path)).merge_and_unload().eval()
    ids = tokenizer([f"{a}+{b}={a + b}" for a in range(10) for b in range(10)], padding=True, return_tensors="pt")
    with torch.no_grad(), policy.disable_adapter():
        base_nf4 = policy.eval()(**ids).logits.log_softmax(-1)
    with torch.no_grad():
        trained, exported = policy(**ids).logits.log_softmax(-1), merged(**ids).logits.log_softmax(-1)
        base = load_tiny_model("addition").eval()(**ids).logits.log_softmax(-1)
    mask = ids["attention_mask"].bool()
    for label, a, b in (
        ("NF4 base vs float32 base", base_nf4, base),
        ("trained vs exported", trained, exported),
        ("trained vs its base (adapter effect)", trained, base_nf4),
    ):
        kl = (a.exp() * (a - b)).sum(-1)[mask]
        print(f"{label}: KL mean {kl.mean():.2e} max {kl.max():.2e}; |d logprob| max {(a - b)[mask].abs().max():.3f}")
    size = sum(f.stat().st_size for f in path.iterdir())
    print(
        f"adapter files: {size / 2**10:.0f} KiB; base (float32 safetensors) would be "
        f"{sum(p.numel() * 4 for p in merged.parameters()) / 2**10:.0f} KiB"
    )


MEASUREMENTS: dict[str, Callable[[Path], None]] = {
    "logits-to-keep": logits_to_keep,
    "fused-head": fused_head,
    "logprob-paths": logprob_paths,
    "min-p": min_p,
    "saved-activations": saved_activations,
    "qlora-export": qlora_export,
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
