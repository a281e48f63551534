"""Hugging Face / peft glue: load the model, attach LoRA, the implicit reference policy, adapter export.

The reference policy is the policy with its adapter disabled (``with policy.disable_adapter():``), so no second
copy of the weights exists.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lightning_grpo.policy.finite import check_finite
from lightning_grpo.policy.hub import announce_model_load, from_pretrained
from lightning_grpo.policy.quantization import (
    Quantization,
    bnb_config,
    check_quantization,
    load_quantized,
    same_kernels_in_both_modes,
)
from lightning_grpo.settings_checks import check_number, literal_choices, named_errors

__all__ = ["PolicyConfig", "export_adapter", "load_policy", "load_tokenizer", "reference_mode", "trainable_names"]

DType = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class PolicyConfig:
    """How the policy is loaded and adapted."""

    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by ``lora_alpha / lora_r``)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input; 0 keeps the sampling and training policies identical."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get an adapter: ``"all-linear"`` (every linear layer but the output head) or a list of module
    names such as ``["q_proj", "v_proj"]``."""
    dtype: DType = "auto"
    """Weight dtype of the base model: ``"auto"`` (bfloat16 on a GPU that supports it, else float32), ``"float32"``,
    ``"bfloat16"`` or ``"float16"``. The adapter is kept in float32."""
    attn_implementation: str | None = None
    """Attention kernel passed to ``from_pretrained`` (e.g. ``"sdpa"``, ``"flash_attention_2"``); ``None`` lets
    transformers choose."""
    gradient_checkpointing: bool = False
    """Recompute activations in the update pass (non-reentrant); never active while sampling."""
    trust_remote_code: bool = False
    """Allow model code from the hub."""
    quantization: Quantization | None = None
    """Quantize the base model's linear layers with bitsandbytes (QLoRA; needs the ``quant`` extra): ``"nf4"`` or
    ``"fp4"`` (4-bit), ``"int8"`` (LLM.int8), or ``None``. Embeddings, norms and the output head keep ``dtype``; the
    adapter is trained on top. See ``docs/quantization.md``."""
    double_quantization: bool = True
    """4-bit only: quantize the per-block scales too (about 0.4 bits less per weight)."""
    compute_dtype: DType = "auto"
    """4-bit only: dtype the quantized layers multiply in; ``"auto"`` uses ``dtype``'s."""
    adapter_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the LoRA weights (and so of their optimizer state): ``"float32"`` (recommended), ``"bfloat16"`` or
    ``"float16"``."""

    def __post_init__(self) -> None:
        with named_errors(self):  # "PolicyConfig.lora_r must be ...": the field first
            self._check()

    def _check(self) -> None:
        check_number("lora_r", self.lora_r, integer=True, minimum=1)
        check_number("lora_alpha", self.lora_alpha, minimum=0, exclusive_minimum=True)
        check_number("lora_dropout", self.lora_dropout, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        for name in ("gradient_checkpointing", "trust_remote_code", "double_quantization"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name, allowed in _CHOICES.items():  # the Literal types' values (quantization: check_quantization)
            if name != "quantization" and getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {getattr(self, name)!r}")
        check_quantization(self.quantization, self.dtype)

    def torch_dtype(self) -> torch.dtype:
        """The dtype ``"auto"`` resolves to on this machine."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if not torch.cuda.is_available():
            return torch.float32
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float16 if self.quantization == "int8" else torch.float32  # LLM.int8 multiplies in float16


def load_tokenizer(
    tokenizer: str | PreTrainedTokenizerBase | None, model_name: str | None, *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """Load (or take) the tokenizer; a tokenizer without a pad token gets its EOS as pad (embeddings not resized)."""
    if tokenizer is None and model_name is None:
        raise ValueError("pass tokenizer= when the model is given as an object rather than a name or path")
    if tokenizer is None or isinstance(tokenizer, str):
        what = "tokenizer" if tokenizer else "model"  # a missing model is reported when its tokenizer is loaded
        tokenizer = from_pretrained(
            AutoTokenizer.from_pretrained, tokenizer or model_name, what, trust_remote_code=trust_remote_code
        )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _load_base(model: str | PreTrainedModel, config: PolicyConfig) -> PreTrainedModel:
    if config.quantization is not None and isinstance(model, PreTrainedModel | str | Path):
        return _load_quantized_base(model, config)
    if isinstance(model, PreTrainedModel):
        return model.to(config.torch_dtype()) if config.dtype != "auto" else model
    if not isinstance(model, str | Path):
        raise TypeError(f"model must be a Hugging Face id, a local path or a PreTrainedModel; got {type(model)}")
    kwargs = {"dtype": config.torch_dtype(), "trust_remote_code": config.trust_remote_code}
    if config.attn_implementation is not None:
        kwargs["attn_implementation"] = config.attn_implementation
    return from_pretrained(AutoModelForCausalLM.from_pretrained, model, "model", announce=True, **kwargs)


def _load_quantized_base(model: str | Path | PreTrainedModel, config: PolicyConfig) -> PreTrainedModel:
    """The base with its linear layers quantized by bitsandbytes (policy/quantization.py, docs/quantization.md)."""
    compute = config.torch_dtype() if config.compute_dtype == "auto" else _DTYPES[config.compute_dtype]
    quantization = bnb_config(
        config.quantization, double_quantization=config.double_quantization, compute_dtype=compute
    )
    kwargs: dict[str, object] = {"trust_remote_code": config.trust_remote_code}
    if config.attn_implementation is not None:
        kwargs["attn_implementation"] = config.attn_implementation
    if not isinstance(model, PreTrainedModel):
        announce_model_load(str(model))
    model = model if isinstance(model, PreTrainedModel) else str(model)
    return load_quantized(model, quantization, dtype=config.torch_dtype(), **kwargs)


_PEFT_AND_QUANTIZATION = (
    "policy.quantization applies to a base model, not a PeftModel; pass the base model (or set quantization: null "
    "to train a PeftModel whose base is already quantized)"
)


def _prepare_adapter_and_kernels(policy: PeftModel, config: PolicyConfig) -> None:
    """Adapter weights in ``adapter_dtype``; a bitsandbytes base samples and trains with the same kernels."""
    same_kernels_in_both_modes(policy)
    if config.adapter_dtype != "float32":
        for param in policy.parameters():
            if param.requires_grad:
                param.data = param.data.to(_DTYPES[config.adapter_dtype])


def load_policy(model: str | PreTrainedModel | PeftModel, config: PolicyConfig, *, seed: int = 0) -> PeftModel:
    """The policy: the base model with a trainable LoRA adapter and every other weight frozen.

    Args:
        model: A Hugging Face id or local path, a ``PreTrainedModel`` (gets a new adapter) or a ``PeftModel`` (its
            active adapter is trained).
        config: Loading and LoRA settings.
        seed: Seed of the adapter's random initialisation.

    Returns:
        The ``PeftModel``; only adapter parameters have ``requires_grad``.
    """
    if isinstance(model, PeftModel):
        if config.quantization is not None:
            raise ValueError(_PEFT_AND_QUANTIZATION)
        policy = model
        for name, param in policy.named_parameters():
            param.requires_grad_("lora_" in name)
    else:
        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=config.target_modules,
            task_type="CAUSAL_LM",
        )
        base = _load_base(model, config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the adapter's initialisation is reproducible, whatever the global RNG state
            with warnings.catch_warnings():  # peft reads transformers' deprecated alias: not the user's to fix
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
                policy = get_peft_model(base, lora)
    _prepare_adapter_and_kernels(policy, config)
    if config.gradient_checkpointing:
        _enable_checkpointing(policy.base_model.model)
    names = trainable_names(policy)
    if not names or any("lora_" not in name for name in names):
        raise RuntimeError(f"only LoRA adapter parameters may be trainable; trainable: {names[:5]}...")
    return policy


def _enable_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant gradient checkpointing of every decoder layer, with the embeddings' output requiring grad.

    Non-reentrant (``use_reentrant=False``): the re-entrant variant warns, needs an input that requires grad, and
    gives no gradient to the adapters of a layer whose input does not. ``enable_input_require_grads`` still marks the
    embeddings' output, so that a frozen base under trainable adapters never meets "element 0 of tensors does not
    require grad" (docs/quantization.md, "Gradient checkpointing"). transformers 5 renamed the method
    (``activation_checkpointing_enable``) and warns on the old name, which older versions still need.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.enable_input_require_grads()


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the parameters that require a gradient."""
    return [name for name, param in model.named_parameters() if param.requires_grad]


@contextmanager
def reference_mode(policy: PeftModel) -> Iterator[PeftModel]:
    """The reference policy: the same model with its adapter disabled, without gradient."""
    with torch.no_grad(), policy.disable_adapter():
        yield policy


def export_adapter(policy: PeftModel, path: str | Path) -> Path:
    """Write the adapter in PEFT format (``adapter_config.json`` + safetensors) for ``PeftModel.from_pretrained``.

    Raises:
        NonFiniteError: An adapter weight holds a NaN or an infinity (nothing is written).
    """
    path = Path(path)
    check_finite(((n, p) for n, p in policy.named_parameters() if p.requires_grad), f"write the adapter to {path}")
    path.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(path))
    return path


#: The allowed values of each ``Literal`` field (``typing.get_args``): the type is the one place they are written.
_CHOICES = literal_choices(PolicyConfig)
