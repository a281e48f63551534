"""The QLoRA memory model of ``docs/quantization.md``: bytes of one GRPO step, from the model's shape and the workload.

``python -m benchmarks.memory_model --model qwen2.5-7b --base nf4 --dtype bfloat16 --rows 8 --sampling-rows 128
--prompt-length 512 --max-new-tokens 512 --gradient-checkpointing`` prints the estimate; ``benchmarks.quantization``
checks it against measured peaks. Every term is a formula of the page; the activation coefficients come from
``python -m benchmarks.micro saved-activations`` (bytes saved for backward per token and decoder layer).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from benchmarks.models import PRESETS, ModelPreset

__all__ = ["SHAPES", "MemoryEstimate", "activation_bytes_per_token", "base_bytes_per_weight", "estimate", "main"]

#: Shapes the estimate knows: the benchmark presets and Qwen2.5-7B (untied embeddings), never built here.
SHAPES: dict[str, ModelPreset] = {**PRESETS, "qwen2.5-7b": ModelPreset(152_064, 3584, 28, 28, 4, 18_944, tied=False)}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: float32 adapter weight + its gradient + AdamW's two moments
ADAPTER_BYTES_PER_PARAM = 16


def base_bytes_per_weight(base: str, in_features: int, *, double_quantization: bool = True) -> float:
    """Bytes per weight of a base linear layer: 4 / 2 unquantized; 4-bit packs two weights a byte plus one absmax
    per 64-weight block (a float32, or with double quantization a uint8 plus a float32 per 256 blocks); int8 is one
    byte plus one float32 scale per output row."""
    if base in _DTYPE_BYTES:
        return float(_DTYPE_BYTES[base])
    if base in ("nf4", "fp4"):
        return 0.5 + (1 / 64 + 4 / (64 * 256) if double_quantization else 4 / 64)
    if base == "int8":
        return 1 + 4 / in_features
    raise ValueError(f"unknown base {base!r}: choose one of {', '.join([*_DTYPE_BYTES, 'nf4', 'fp4', 'int8'])}")


def activation_bytes_per_token(shape: ModelPreset, compute_bytes: int) -> float:
    """Bytes one token saves for backward in one decoder layer with LoRA on every linear layer (no checkpointing).

    Fitted over six shapes by ``python -m benchmarks.micro saved-activations`` (residual under 10 bytes): with
    ``kvd = kv_heads * head_dim``, float32 compute saves ``24 h + 16 I + 8 kvd + 466`` bytes, 16-bit compute
    ``36 h + 10 I + 4 kvd + 466`` (the RMSNorms upcast to float32 and save their float32 input).
    """
    h, inter = shape.hidden_size, shape.intermediate_size
    kvd = shape.num_kv_heads * (h // shape.num_heads)
    if compute_bytes == 4:
        return 24 * h + 16 * inter + 8 * kvd + 466
    return 36 * h + 10 * inter + 4 * kvd + 466


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each term; ``total`` is what one GRPO step needs at its peak (libraries and allocator not counted)."""

    base_linear: float
    base_other: float
    adapter: float
    activations: float
    generation: float

    @property
    def total(self) -> float:
        """Weights + adapter state + the larger of the update pass's activations and the sampling pass's cache."""
        return self.base_linear + self.base_other + self.adapter + max(self.activations, self.generation)


def _linear_shapes(shape: ModelPreset) -> list[tuple[int, int]]:
    """``(in, out)`` of the seven linear layers of one decoder layer: q, k, v, o, gate, up, down."""
    h, inter = shape.hidden_size, shape.intermediate_size
    kvd = shape.num_kv_heads * (h // shape.num_heads)
    return [(h, h), (h, kvd), (h, kvd), (h, h), (h, inter), (h, inter), (inter, h)]


def estimate(
    shape: ModelPreset,
    *,
    base: str,
    dtype: str,
    lora_r: int,
    rows: int,
    prompt_length: int,
    max_new_tokens: int,
    gradient_checkpointing: bool,
    distinct_prompts: int | None = None,
    sampling_rows: int | None = None,
    double_quantization: bool = True,
) -> MemoryEstimate:
    """The memory model of ``docs/quantization.md`` ("Memory model").

    Args:
        shape: The model's sizes.
        base: Format of the base linear layers: ``"float32"``, ``"bfloat16"``, ``"nf4"``, ``"fp4"`` or ``"int8"``.
        dtype: Dtype of everything not quantized and of the activations.
        lora_r: LoRA rank (float32 adapters on every linear layer, AdamW).
        rows: Completions per forward/backward (the micro-batch, ``micro_batch_size``).
        prompt_length: Prompt tokens (P).
        max_new_tokens: Completion tokens (T).
        gradient_checkpointing: Whether the update pass keeps only each layer's input.
        distinct_prompts: Distinct prompts in a micro-batch: without checkpointing ``B·P + rows·T`` tokens pass
            (shared prompts) instead of ``rows·(P+T)``. ``None``: every row runs its own prompt.
        sampling_rows: Completions sampled together (B·G); ``None``: ``rows``.
        double_quantization: 4-bit only.
    """
    b = _DTYPE_BYTES[dtype]
    linear, other, adapter = _weight_bytes(shape, base, b, lora_r, double_quantization)
    activations, generation = _pass_bytes(
        shape,
        b,
        rows=rows,
        prompt_length=prompt_length,
        max_new_tokens=max_new_tokens,
        gradient_checkpointing=gradient_checkpointing,
        distinct_prompts=distinct_prompts,
        sampling_rows=sampling_rows or rows,
    )
    return MemoryEstimate(linear, other, adapter, activations, generation)


def _weight_bytes(
    shape: ModelPreset, base: str, b: int, lora_r: int, double_quantization: bool
) -> tuple[float, float, float]:
    """Bytes of the base's linear layers, of its other weights (in ``b`` bytes each) and of the adapter state."""
    layers, h = shape.num_layers, shape.hidden_size
    linears = _linear_shapes(shape)
    per_layer = sum(i * o * base_bytes_per_weight(base, i, double_quantization=double_quantization) for i, o in linears)
    kvd = linears[1][1]
    embeddings = shape.vocab_size * h * (1 if shape.tied else 2)
    other = (embeddings + layers * (2 * h + h + 2 * kvd) + h) * b  # + norms, q/k/v biases, final norm
    adapter = ADAPTER_BYTES_PER_PARAM * layers * lora_r * sum(i + o for i, o in linears)
    return layers * per_layer, other, adapter


def _pass_bytes(
    shape: ModelPreset,
    b: int,
    *,
    rows: int,
    prompt_length: int,
    max_new_tokens: int,
    gradient_checkpointing: bool,
    distinct_prompts: int | None,
    sampling_rows: int,
) -> tuple[float, float]:
    """Bytes of the update pass (saved activations, one layer's recompute or backward, the head's hidden states) and
    of the sampling pass (KV cache of every sampled row, one step's logits)."""
    layers, h = shape.num_layers, shape.hidden_size
    linears = _linear_shapes(shape)
    tokens = rows * (prompt_length + max_new_tokens)
    if distinct_prompts is not None and not gradient_checkpointing:  # checkpointing always takes the full forward
        tokens = distinct_prompts * prompt_length + rows * max_new_tokens
    per_token = activation_bytes_per_token(shape, b)
    saved = tokens * layers * (h * b if gradient_checkpointing else per_token)
    one_layer = tokens * per_token + max(i * o for i, o in linears) * b  # recompute / backward, a dequantized weight
    hidden_states = 2 * rows * max_new_tokens * h * 4  # the fused head's input and its float32 gradient
    kv_cache = sampling_rows * (prompt_length + max_new_tokens) * 2 * layers * linears[1][1] * b
    logits = sampling_rows * shape.vocab_size * 4 * 2  # one decoding step's float32 logits and their softmax
    return saved + one_layer + hidden_states, kv_cache + logits


def main(argv: list[str] | None = None) -> MemoryEstimate:
    """Print the estimate of one configuration, term by term, in GiB."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_model", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-7b")
    parser.add_argument("--base", choices=[*_DTYPE_BYTES, "nf4", "fp4", "int8"], default="nf4")
    parser.add_argument("--dtype", choices=list(_DTYPE_BYTES), default="bfloat16")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--rows", type=int, default=8, help="completions per forward/backward (micro-batch)")
    parser.add_argument("--sampling-rows", type=int, default=None, help="completions sampled together (B*G)")
    parser.add_argument("--prompts", type=int, default=None, help="distinct prompts in a micro-batch (shared)")
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    result = estimate(
        SHAPES[args.model],
        base=args.base,
        dtype=args.dtype,
        lora_r=args.lora_r,
        rows=args.rows,
        prompt_length=args.prompt_length,
        max_new_tokens=args.max_new_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
        distinct_prompts=args.prompts,
        sampling_rows=args.sampling_rows,
    )
    for name in ("base_linear", "base_other", "adapter", "activations", "generation", "total"):
        print(f"{name:12s} {getattr(result, name) / 2**30:8.2f} GiB")
    return result


if __name__ == "__main__":
    main()
