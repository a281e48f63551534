"""Hugging Face / peft glue: load the model, attach LoRA, the implicit reference policy, adapter export.

The reference policy is the policy with its adapter disabled (``with policy.disable_adapter():``), so no second
copy of the weights exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lightning_grpo.tiny import build_tiny_tokenizer, is_tiny_name, load_tiny_model

__all__ = ["PolicyConfig", "export_adapter", "load_policy", "load_tokenizer", "reference_mode", "trainable_names"]

DType = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class PolicyConfig:
    """How the policy is loaded and adapted.

    Attributes:
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator (the update is scaled by ``lora_alpha / lora_r``).
        lora_dropout: Dropout on the LoRA input; 0 keeps the sampling and training policies identical.
        target_modules: Modules that get an adapter: ``"all-linear"`` (every linear layer but the output head) or a
            list of module names such as ``["q_proj", "v_proj"]``.
        dtype: Weight dtype of the base model: ``"auto"`` (bfloat16 on a GPU that supports it, else float32),
            ``"float32"``, ``"bfloat16"`` or ``"float16"``. The adapter is kept in float32.
        attn_implementation: Attention kernel passed to ``from_pretrained`` (e.g. ``"sdpa"``,
            ``"flash_attention_2"``); ``None`` lets transformers choose.
        gradient_checkpointing: Recompute activations in the update pass (non-reentrant); never active while sampling.
        trust_remote_code: Allow model code from the hub.
    """

    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    dtype: DType = "auto"
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.lora_r < 1:
            raise ValueError(f"policy.lora_r must be >= 1, got {self.lora_r}")
        if self.lora_alpha <= 0:
            raise ValueError(f"policy.lora_alpha must be > 0, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"policy.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.dtype not in (*_DTYPES, "auto"):
            raise ValueError(f"policy.dtype must be one of 'auto', {', '.join(map(repr, _DTYPES))}; got {self.dtype!r}")

    def torch_dtype(self) -> torch.dtype:
        """The dtype ``"auto"`` resolves to on this machine."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32


def load_tokenizer(
    tokenizer: str | PreTrainedTokenizerBase | None, model_name: str | None, *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """Load (or take) the tokenizer; a tokenizer without a pad token gets its EOS as pad (embeddings not resized)."""
    if tokenizer is None and model_name is None:
        raise ValueError("pass tokenizer= when the model is given as an object rather than a name or path")
    if tokenizer is None or isinstance(tokenizer, str):
        name = tokenizer or model_name
        if is_tiny_name(name):  # "tiny:<task>": the character-level tokenizer built in code (lightning_grpo.tiny)
            tokenizer = build_tiny_tokenizer()
        else:
            tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _load_base(model: str | PreTrainedModel, config: PolicyConfig) -> PreTrainedModel:
    if is_tiny_name(model):  # "tiny:<task>": a small model built in code and warmed up on the task (cached)
        model = load_tiny_model(model)
    if isinstance(model, PreTrainedModel):
        return model.to(config.torch_dtype()) if config.dtype != "auto" else model
    if not isinstance(model, str | Path):
        raise TypeError(f"model must be a Hugging Face id, a local path or a PreTrainedModel; got {type(model)}")
    kwargs = {"dtype": config.torch_dtype(), "trust_remote_code": config.trust_remote_code}
    if config.attn_implementation is not None:
        kwargs["attn_implementation"] = config.attn_implementation
    return AutoModelForCausalLM.from_pretrained(str(model), **kwargs)


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
            policy = get_peft_model(base, lora)
    if config.gradient_checkpointing:
        policy.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.base_model.model.enable_input_require_grads()
    names = trainable_names(policy)
    if not names or any("lora_" not in name for name in names):
        raise RuntimeError(f"only LoRA adapter parameters may be trainable; trainable: {names[:5]}...")
    return policy


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the parameters that require a gradient."""
    return [name for name, param in model.named_parameters() if param.requires_grad]


@contextmanager
def reference_mode(policy: PeftModel) -> Iterator[PeftModel]:
    """The reference policy: the same model with its adapter disabled, without gradient."""
    with torch.no_grad(), policy.disable_adapter():
        yield policy


def export_adapter(policy: PeftModel, path: str | Path) -> Path:
    """Write the adapter in PEFT format (``adapter_config.json`` + safetensors) for ``PeftModel.from_pretrained``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(path))
    return path
