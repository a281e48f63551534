"""The policy's weights under Hugging Face names: the base alone, or with the LoRA adapter merged in.

What a sampling engine loads (docs/vllm.md): the base once at start, and (``vllm.sync: merged``) every weight with the
adapter merged after each update. The policy itself is never modified (no ``merge_adapter``/``unmerge_adapter``
round trip, whose rounding would drift the base).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

__all__ = ["base_weights", "merged_weights"]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (a DTensor) is all-gathered (a collective: every rank must call)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _hf_name(peft_name: str) -> str:
    """``base_model.model.model.layers.0.q_proj.base_layer.weight`` -> ``model.layers.0.q_proj.weight``."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def base_weights(policy: PeftModel) -> Iterator[tuple[str, torch.Tensor]]:
    """Every base weight (adapter off) under the model's own names, ``lm_head.weight`` included even when tied.

    A tied output head is listed once by ``named_parameters``; engines that rebuild their weights from this list
    (vLLM's ``reload_weights``) need it by name, or they sample from a stale head.
    """
    names = set()
    for name, param in policy.named_parameters(remove_duplicate=False):
        if "lora_" in name:
            continue
        names.add(_hf_name(name))
        yield _hf_name(name), _full(param.detach())
    head = policy.get_output_embeddings()
    if "lm_head.weight" not in names and head is not None:
        yield "lm_head.weight", _full(head.weight.detach())


def merged_weights(policy: PeftModel) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the policy with its active adapter merged in (``W + scale * B @ A``), base untouched."""
    adapter = policy.active_adapter
    deltas = {}
    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            deltas[_hf_name(name) + ".weight"] = module
    for name, weight in base_weights(policy):
        layer = deltas.get(name)
        if layer is None:
            yield name, weight
        else:
            with torch.no_grad():
                yield name, weight + layer.get_delta_weight(adapter).to(weight.dtype)
