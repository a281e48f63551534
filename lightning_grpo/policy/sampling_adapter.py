"""Sampling with fewer kernel launches per token: the adapter in the base dtype, or merged into the base weights.

peft casts each LoRA input to the adapter's dtype and the result back: with a float32 adapter on a bfloat16 base,
a decode step runs about twice the ATen calls of the base model alone (docs/benchmarks.md, "GPU readiness"), and
decoding on a GPU is bound by those launches. For the time of sampling, :func:`adapter_in_base_dtype` puts a copy of
the LoRA weights in the dtype of the layer each sits on, so peft casts nothing; the trained float32 weights are put
back afterwards, untouched (the optimizer never sees the copy). :func:`merged_adapter` goes further: the adapter's
product is added into each base weight for the time of sampling (and the adapter path switched off), so a decode step
costs what the base model alone costs; the base weights it changed are kept aside and put back bit for bit, which
holds a copy of the adapted layers' weights while sampling.

What it changes: the rollout is sampled from the policy with its LoRA weights rounded to the base dtype. Training
still scores the float32 policy (old, reference and current log-probs are unchanged); the behaviour log-probs the
sampler records are those of the rounded policy, so ``train/rollout_logprob_diff_*`` shows the difference, as it
does for vLLM, and ``rollout_correction`` can correct for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["adapter_in_base_dtype", "merged_adapter", "sampling_adapter"]


@contextmanager
def adapter_in_base_dtype(model: nn.Module, enabled: bool = True) -> Iterator[int]:
    """LoRA weights in the dtype of their base layer inside the block; the trained weights restored on exit.

    Layers whose base weight is not a float (quantized) or already shares the adapter's dtype are left alone.

    Args:
        model: A peft model (or a model holding peft LoRA layers).
        enabled: ``False``: do nothing (the default setting, ``"as_trained"``).

    Yields:
        The number of LoRA weights cast.

    Example::

        >>> from peft import LoraConfig, get_peft_model
        >>> base = nn.Sequential(nn.Linear(4, 4)).to(torch.bfloat16)
        >>> model = get_peft_model(base, LoraConfig(r=2, target_modules=["0"]))
        >>> weight = model.base_model.model[0].lora_A["default"].weight
        >>> with adapter_in_base_dtype(model) as cast:
        ...     cast, weight.dtype
        (2, torch.bfloat16)
        >>> weight.dtype
        torch.float32
    """
    with _restored() as saved:
        for layer in model.modules() if enabled else ():
            saved.extend(_cast_layer(layer))
        yield len(saved)


@contextmanager
def _restored() -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """A list of ``(tensor, original data)`` to fill; each tensor gets its original data back on exit."""
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        yield saved
    finally:
        for tensor, data in saved:
            tensor.data = data


def _cast_layer(layer: nn.Module) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """Cast one LoRA layer's A and B weights to its base weight's dtype; return the originals."""
    if not (hasattr(layer, "lora_A") and hasattr(layer, "get_base_layer")):
        return []
    base_weight = getattr(layer.get_base_layer(), "weight", None)
    if base_weight is None or not base_weight.is_floating_point():
        return []
    saved = []
    for adapter in (*layer.lora_A.values(), *layer.lora_B.values()):
        for parameter in adapter.parameters():
            if parameter.dtype != base_weight.dtype:
                saved.append((parameter, parameter.data))
                parameter.data = parameter.data.to(base_weight.dtype)
    return saved


@contextmanager
def merged_adapter(model: nn.Module) -> Iterator[int]:
    """Each active LoRA product added into its base weight, the adapter path off; the base weights restored on exit.

    The weights are merged in the base dtype (as vLLM's merged sync does), the originals kept on their device and
    put back exactly, so the reference policy (the adapter disabled) is unchanged.

    Args:
        model: A ``PeftModel`` whose LoRA layers sit on floating-point (not quantized) base weights.

    Yields:
        The number of base weights merged.

    Raises:
        ValueError: A LoRA layer sits on a quantized base weight (merging would dequantize it).
    """
    with _restored() as saved:
        with torch.no_grad():
            for layer in model.modules():
                saved.extend(_merge_layer(layer))
        with model.disable_adapter():
            yield len(saved)


def _merge_layer(layer: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Add one LoRA layer's active products into its base weight; return the weight and its original data."""
    if not (hasattr(layer, "lora_A") and hasattr(layer, "get_delta_weight")):
        return []
    weight = layer.get_base_layer().weight
    if not weight.is_floating_point():
        raise ValueError(
            "sampling_adapter='merged' needs floating-point base weights; this base is quantized: use 'base_dtype'"
        )
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if not active:
        return []
    original = weight.data
    merged = original.clone()
    for name in active:
        merged += layer.get_delta_weight(name).to(merged.dtype)
    weight.data = merged
    return [(weight, original)]


@contextmanager
def sampling_adapter(model: nn.Module, mode: str) -> Iterator[None]:
    """The policy as ``GRPOConfig.sampling.sampling_adapter`` samples it: ``"as_trained"``, ``"base_dtype"`` or
    ``"merged"``."""
    if mode == "merged":
        with merged_adapter(model):
            yield
    else:
        with adapter_in_base_dtype(model, mode == "base_dtype"):
            yield
