"""``python -m benchmarks.gpu_readiness``: ATen calls and host syncs of the hot paths, counted on the CPU.

What a GPU pays per kernel launch and per host sync does not show on a CPU, so these are counted
(:class:`~lightning_grpo.testing.dispatch.DispatchCounter`) at the Qwen2.5-0.5B recipe's shapes where the ``meta``
device allows, and on a 2-layer Qwen2 model otherwise. docs/benchmarks.md, "GPU readiness", holds the figures.

Example::

    python -m benchmarks.gpu_readiness
"""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from lightning_grpo.algorithms.fused_head import FusedHeadLogProbs
from lightning_grpo.policy.sampling_adapter import sampling_adapter
from lightning_grpo.testing.dispatch import DispatchCounter

__all__ = ["decode_step_calls", "fused_head_counts", "main"]


def fused_head_counts(tile_mib: int | None = None) -> dict[str, int]:
    """Tiles, ATen calls and syncs of the fused head at the 0.5B recipe's micro-batch (16 x 512), on ``meta``."""
    hidden = torch.empty(16, 512, 896, device="meta", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.empty(151_936, 896, device="meta", dtype=torch.bfloat16)
    targets = torch.zeros(16, 512, dtype=torch.long, device="meta")
    tile_bytes = None if tile_mib is None else tile_mib * 2**20
    with DispatchCounter() as forward:
        logprobs, entropy = FusedHeadLogProbs.apply(hidden, weight, None, targets, 1.0, 1024, True, tile_bytes)
    with DispatchCounter() as backward:
        (logprobs.sum() + entropy.sum()).backward()
    return {
        "tiles": forward.ops["aten.mm.default"],
        "forward calls": forward.calls,
        "forward syncs": forward.syncs,
        "backward calls": backward.calls,
        "backward syncs": backward.syncs,
    }


def decode_step_calls(mode: str, layers: int = 2) -> int:
    """ATen calls of one decode step (one token, KV cache of 16) of a bf16 Qwen2 with an fp32 all-linear adapter."""
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    base = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model = get_peft_model(base, LoraConfig(r=8, target_modules="all-linear"))  # fp32 adapter (peft's autocast)
    ids = torch.randint(1024, (4, 16))
    with torch.no_grad(), sampling_adapter(model, mode):
        cache = model(input_ids=ids, use_cache=True).past_key_values
        with DispatchCounter() as counter:
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    return counter.calls


def main() -> None:
    for tile_mib in (None, 64):
        label = "fused head, default tiles (GPU)" if tile_mib is None else f"fused head, {tile_mib} MiB tiles"
        print(label, fused_head_counts(tile_mib))
    for mode in ("as_trained", "base_dtype", "merged"):
        print(f"decode step, 2-layer bf16 Qwen2, sampling_adapter={mode!r}: {decode_step_calls(mode)} ATen calls")


if __name__ == "__main__":
    main()
