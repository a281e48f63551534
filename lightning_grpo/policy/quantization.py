"""Quantized base models through bitsandbytes (QLoRA): NF4 / FP4 4-bit or LLM.int8 8-bit, with a float32 adapter.

The base model is quantized by transformers at ``from_pretrained`` time (``BitsAndBytesConfig``). A model passed as
an object is written to a temporary directory with ``save_pretrained`` and loaded back with the quantization config,
so it is quantized exactly as the same model loaded from a path would be (same layers, same skipped output head).
Every linear layer of the decoder becomes a bitsandbytes layer (``Linear4bit`` / ``Linear8bitLt``); the embeddings,
the norms and the output head keep ``dtype``. The adapter is trained on top; the reference policy is still the adapter
disabled, now the quantized base. See ``docs/quantization.md``.

Two bitsandbytes behaviours are switched off after loading, because they would make the sampling pass (eval mode, no
gradient) compute with other kernels than the training pass:

* On CPUs with AVX-512 BF16, ``Linear4bit`` repacks its weight for an inference kernel the first time it runs in eval
  mode without gradient; the repacked layer then fails in training mode.
* On CPU, ``Linear8bitLt`` multiplies in eval mode with int8 activations, in training mode with the dequantized weight.
  The layer is kept on the training path (dequantized weight) in both modes. On CUDA both modes take the same path.
"""

from __future__ import annotations

import importlib
import tempfile
import warnings
from typing import Any, Literal

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from lightning_grpo.extras import install_hint

__all__ = [
    "BLOCK_SIZE",
    "QUANTIZATIONS",
    "Quantization",
    "bnb_config",
    "check_quantization",
    "check_shardable",
    "is_quantized",
    "load_quantized",
    "local_rank",
    "quantized_layers",
    "require_bitsandbytes",
    "same_kernels_in_both_modes",
]

Quantization = Literal["nf4", "fp4", "int8"]
QUANTIZATIONS: tuple[str, ...] = ("nf4", "fp4", "int8")
#: bitsandbytes' 4-bit block size: each run of 64 consecutive weights of a row shares one scale (absmax).
BLOCK_SIZE = 64


def require_bitsandbytes() -> Any:
    """The ``bitsandbytes`` module, or an ``ImportError`` that names the extra to install."""
    try:
        return importlib.import_module("bitsandbytes")
    except ImportError as error:
        raise ImportError(
            f"policy.quantization needs bitsandbytes, which is not installed: {install_hint('quant')} "
            "(installs bitsandbytes and accelerate, never another torch)"
        ) from error


def check_quantization(quantization: str | None, dtype: str) -> None:
    """Refuse an unknown quantization name and the combination ``int8`` + ``dtype: float32``.

    LLM.int8 multiplies in float16 on CUDA: bitsandbytes casts float32 activations to float16 at every quantized layer
    (and logs a warning at every call), so a float32 run would silently compute in float16, with its 65504 range.

    Raises:
        ValueError: An unknown name, or ``int8`` with ``dtype="float32"``.
    """
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        options = ", ".join(repr(q) for q in (*QUANTIZATIONS, None))
        raise ValueError(f"policy.quantization={quantization!r} is not valid; choose one of {options}")
    if quantization == "int8" and dtype == "float32":
        raise ValueError(
            "policy.quantization='int8' cannot run with policy.dtype='float32': LLM.int8 multiplies in float16 on "
            "CUDA, so float32 activations would be cast to float16 at every layer. Use dtype 'bfloat16', 'float16' "
            "or 'auto', or quantization 'nf4' (4-bit layers compute in any dtype, see policy.compute_dtype)"
        )


def bnb_config(quantization: Quantization, *, double_quantization: bool, compute_dtype: torch.dtype) -> Any:
    """The transformers ``BitsAndBytesConfig`` of a quantization name (output head and embeddings not quantized)."""
    require_bitsandbytes()
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quantization,
        bnb_4bit_use_double_quant=double_quantization,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def load_quantized(model: str | PreTrainedModel, config: Any, *, dtype: torch.dtype, **kwargs: Any) -> PreTrainedModel:
    """Load ``model`` (a path or id, or a model object) with ``config`` (a ``BitsAndBytesConfig``).

    Args:
        model: A Hugging Face id or local path, or an unquantized ``PreTrainedModel`` (saved and reloaded).
        config: The quantization config (:func:`bnb_config`).
        dtype: Dtype of the layers that stay unquantized (embeddings, norms, output head).
        **kwargs: Further ``from_pretrained`` arguments (``trust_remote_code``, ``attn_implementation``).

    Raises:
        ValueError: The model is already quantized, or a layer's input size is not a multiple of :data:`BLOCK_SIZE`.
    """
    options = {"quantization_config": config, "dtype": dtype, "device_map": _device_map(), **kwargs}
    if isinstance(model, PreTrainedModel):
        if is_quantized(model):
            raise ValueError(
                "policy.quantization is set but the model passed is already quantized; pass the unquantized model, "
                "or set quantization: null to train this one as it is"
            )
        with tempfile.TemporaryDirectory(prefix="lightning_grpo_quantize_") as directory:
            model.save_pretrained(directory)
            loaded = type(model).from_pretrained(directory, **options)
    else:
        loaded = AutoModelForCausalLM.from_pretrained(str(model), **options)
    _check_block_size(loaded)
    return loaded


def _device_map() -> dict[str, Any]:
    """The whole model on this process's GPU (``cuda:<local rank>``), else on the CPU.

    The policy loads in ``GRPOModule.__init__``, before the Trainer has set each rank's device, so the local rank is
    read the way the Trainer will read it (:func:`local_rank`): under ``srun`` that is ``SLURM_LOCALID``, under
    torchrun ``LOCAL_RANK``. A rank that sees fewer GPUs than its local rank (each rank started with only its own GPU
    visible) takes its current device, the one it sees.
    """
    if not torch.cuda.is_available():
        return {"": "cpu"}
    rank = local_rank()
    return {"": rank if rank < torch.cuda.device_count() else torch.cuda.current_device()}


def local_rank() -> int:
    """This process's rank on its node, from the cluster environment Lightning's Trainer will choose.

    The environments are tried in the Trainer's order (torchelastic, SLURM, LSF, MPI; a SLURM job named ``bash`` or
    ``interactive`` is not a SLURM launch), falling back to ``LOCAL_RANK`` or 0. Lightning is imported here only, so
    this layer keeps to transformers and peft at import time.
    """
    from lightning.fabric.plugins import environments

    kinds = (
        environments.TorchElasticEnvironment,
        environments.SLURMEnvironment,
        environments.LSFEnvironment,
        environments.MPIEnvironment,
    )
    with warnings.catch_warnings():  # the Trainer gives SLURM's "srun is available but not used" hint itself
        warnings.simplefilter("ignore")
        chosen = next((kind() for kind in kinds if kind.detect()), environments.LightningEnvironment())
    return chosen.local_rank()


def quantized_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The bitsandbytes layers of ``model`` by name (empty when bitsandbytes is not installed)."""
    try:
        bnb = importlib.import_module("bitsandbytes")
    except ImportError:
        return {}
    kinds = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    return {name: module for name, module in model.named_modules() if isinstance(module, kinds)}


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes layers (or transformers marked it as loaded in 4 or 8 bits)."""
    marked = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    return bool(marked) or bool(quantized_layers(model))


def _check_block_size(model: nn.Module) -> None:
    """Each 4-bit layer's input size must be a multiple of the block size, so that no block straddles two rows.

    bitsandbytes would still run such a layer, but only by dequantizing its whole weight at every call (its fast CUDA
    kernels need whole blocks per row): the memory and speed QLoRA is for would silently be lost.
    """
    bnb = require_bitsandbytes()
    for name, layer in quantized_layers(model).items():
        if isinstance(layer, bnb.nn.Linear4bit) and layer.in_features % BLOCK_SIZE:
            raise ValueError(
                f"layer {name!r} ({layer.in_features} inputs -> {layer.out_features} outputs) cannot be quantized to "
                f"4 bits: its input size {layer.in_features} is not a multiple of bitsandbytes' block size "
                f"{BLOCK_SIZE}. Use quantization 'int8' (row-wise, no blocks) or none for this model"
            )


def same_kernels_in_both_modes(model: nn.Module) -> None:
    """Sampling (eval mode) and training compute with the same bitsandbytes kernels (see the module docstring).

    A no-op for a model without bitsandbytes layers; calling it twice changes nothing more.
    """
    for layer in quantized_layers(model).values():
        if hasattr(layer, "support_avx512bf16_for_cpu"):  # Linear4bit
            layer.support_avx512bf16_for_cpu = False
        elif not getattr(layer, "_lightning_grpo_training_path", False):  # Linear8bitLt
            layer.register_forward_pre_hook(_int8_training_path)
            layer._lightning_grpo_training_path = True


def _int8_training_path(layer: nn.Module, args: tuple[Any, ...]) -> None:
    """``Linear8bitLt`` picks its CPU kernel from ``training``; it has no dropout, so nothing else depends on it."""
    layer.training = True


def check_shardable(model: nn.Module) -> None:
    """Refuse FSDP2 for a quantized base: bitsandbytes keeps each layer's scales outside the weight tensor.

    ``fully_shard`` would split the packed 4-bit (or int8) weight across ranks but not its quantization state, so no
    rank could dequantize its shard.

    Raises:
        ValueError: ``model`` holds bitsandbytes layers.
    """
    if is_quantized(model):
        raise ValueError(
            "FSDP2 (ModelParallelStrategy) with a quantized base (policy.quantization) is not supported: bitsandbytes "
            "keeps the quantization scales outside the weights, which fully_shard cannot split. Use DDP "
            "(strategy: ddp; every GPU holds the whole 4-bit model) or a single GPU"
        )
