"""The name of the KV cache in Hugging Face models: ``cache`` from the transformers release that renamed it,
``past_key_values`` before (the old name warns there, and is to be removed in transformers 5.40).

One place decides, from the installed transformers' output class, so that the calls carry the supported name on
both sides of the rename (the suite runs under transformers 5.19 with vLLM, and under the newest one without).
"""

from __future__ import annotations

from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["CACHE_KEYWORD", "cache_of", "with_cache"]

#: The keyword of the KV cache in a model's ``forward``/``generate`` and the field of its output.
CACHE_KEYWORD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_of(output: Any) -> Any:
    """The KV cache a model's forward returned."""
    return getattr(output, CACHE_KEYWORD)


def with_cache(cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for a model's ``forward`` or ``generate``."""
    return {CACHE_KEYWORD: cache}
