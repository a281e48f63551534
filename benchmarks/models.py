"""Benchmark models: named Qwen2-shaped configs with random weights and tokenizers built in code (no hub access).

``tiny`` reuses :mod:`lightning_grpo.tiny` (character tokenizer, ~100 tokens). The other presets use a word-level
tokenizer whose vocabulary ``w4 ... w{V-1}`` has exactly the model's vocabulary size, so the output head has its
realistic cost. Both sides of a comparison load the same files written by :func:`save_model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

__all__ = [
    "PRESETS",
    "ModelPreset",
    "ParamCounts",
    "build_word_tokenizer",
    "load_tokenizer",
    "param_counts",
    "prepare_model",
]

_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
_MARKER = "BENCH_TOKENIZER"


@dataclass(frozen=True)
class ModelPreset:
    """A Qwen2-shaped decoder: sizes only, weights random."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    tied: bool = True

    def config(self) -> Qwen2Config:
        """The transformers config (tied embeddings unless ``tied`` is false, as in Qwen2.5-0.5B)."""
        return Qwen2Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            rms_norm_eps=1e-6,
            tie_word_embeddings=self.tied,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )


#: Named configs. ``small-30m`` has ~30M parameters (12.6M in the tied embedding/output head);
#: ``qwen2.5-0.5b`` has the shape of Qwen2.5-0.5B (494M parameters).
PRESETS: dict[str, ModelPreset] = {
    "small-30m": ModelPreset(32_768, 384, 8, 6, 2, 1536),
    "qwen2.5-0.5b": ModelPreset(151_936, 896, 24, 14, 2, 4864, max_position_embeddings=32_768),
}


def build_word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer with ``vocab_size`` entries: 4 specials, then ``w4`` ... ``w{V-1}``.

    Args:
        vocab_size: Total vocabulary size (specials included).

    Returns:
        A fast tokenizer (pad 0, EOS 1, BOS 2, UNK 3, left padding) that adds no special tokens when encoding.
    """
    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(_SPECIALS), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces; survives a save
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        padding_side="left",
    )


def prepare_model(name: str, directory: Path, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    """Write the model and tokenizer named ``name`` to ``directory``; a path to an existing model is returned as is.

    Args:
        name: ``"tiny"``, a key of :data:`PRESETS`, or a local directory holding a model and its tokenizer.
        directory: Where to save a built model.
        dtype: Dtype of the saved weights.
        seed: Seed of the random initialisation.

    Returns:
        The directory to load both sides from.

    Raises:
        ValueError: ``name`` is neither a preset nor an existing directory.
    """
    if Path(name).is_dir():
        return Path(name)
    if name == "tiny":
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(tokenizer, seed=seed)
    elif name in PRESETS:
        tokenizer = build_word_tokenizer(PRESETS[name].vocab_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(PRESETS[name].config())
    else:
        raise ValueError(f"unknown model {name!r}: choose 'tiny', {', '.join(map(repr, PRESETS))} or a local path")
    directory.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / _MARKER).write_text("tokenizer built in code: load it as PreTrainedTokenizerFast\n")
    return directory


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model_dir``, loaded the same way on both sides.

    A tokenizer built here is loaded as a plain ``PreTrainedTokenizerFast``: ``AutoTokenizer`` would pick the class
    registered for the model type (Qwen2's byte-level tokenizer) and change how it splits and joins text.
    """
    if (Path(model_dir) / _MARKER).exists():
        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    return AutoTokenizer.from_pretrained(model_dir)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts that enter the FLOP and byte estimates.

    Attributes:
        body: Decoder-layer and final-norm parameters (used by every position).
        head: Output-head parameters (used only where logits are computed).
        embedding: Input-embedding parameters (a lookup: no FLOPs); shared with ``head`` when tied.
        total: Distinct parameters (tied weights counted once).
        layers, kv_heads, head_dim: Shape of the KV cache.
        attention_dim: Query heads × head dimension (the width of the attention scores' products).
    """

    body: int
    head: int
    embedding: int
    total: int
    layers: int
    kv_heads: int
    head_dim: int
    attention_dim: int = 0


def param_counts(model: Path | PretrainedConfig) -> ParamCounts:
    """Count the parameters of the model saved in a directory (or of a config) from its config alone (no weights)."""
    cfg = model if isinstance(model, PretrainedConfig) else AutoConfig.from_pretrained(model)
    h, layers, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    attention = h * q + 2 * h * kv + q * h + q + 2 * kv  # q, k, v, o projections and the q/k/v biases of Qwen2
    per_layer = attention + 3 * h * inter + 2 * h  # + gate/up/down MLP and two RMSNorms
    body = layers * per_layer + h
    embedding = cfg.vocab_size * h
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    total = body + embedding + (0 if tied else embedding)
    return ParamCounts(body, embedding, embedding, total, layers, cfg.num_key_value_heads, head_dim, q)
