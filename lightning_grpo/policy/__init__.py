"""The policy: load a Hugging Face model (from the hub, quantized or not), attach LoRA, the implicit reference.

The reference policy is the policy with its adapter disabled, so no second copy of the weights exists.
:mod:`~lightning_grpo.policy.loading` loads and adapts, :mod:`~lightning_grpo.policy.quantization` quantizes the
base with bitsandbytes (QLoRA), :mod:`~lightning_grpo.policy.hub` turns failed downloads into clear errors.
"""

from lightning_grpo.policy.finite import NonFiniteError
from lightning_grpo.policy.hub import ModelLoadError
from lightning_grpo.policy.loading import (
    PolicyConfig,
    export_adapter,
    load_policy,
    load_tokenizer,
    reference_mode,
    trainable_names,
)

__all__ = [
    "ModelLoadError",
    "NonFiniteError",
    "PolicyConfig",
    "export_adapter",
    "load_policy",
    "load_tokenizer",
    "reference_mode",
    "trainable_names",
]
