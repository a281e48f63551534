"""Tiny models and tokenizers built in code, for tests and the offline demo.

Nothing here touches the network: the tokenizer is character-level and built from a fixed alphabet, and the model is
a randomly initialised Qwen2-architecture decoder built from a config.

Example::

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
"""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

__all__ = ["ALPHABET", "build_tiny_model", "build_tiny_tokenizer"]

#: Characters the tiny tokenizer knows, one token each.
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
_SPECIAL = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}


def build_tiny_tokenizer(*, with_pad: bool = True) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of :data:`ALPHABET` plus special tokens.

    Args:
        with_pad: Give the tokenizer a pad token. ``False`` builds one without, as many base-model tokenizers are.

    Returns:
        A fast tokenizer whose ``decode(encode(text)) == text`` for any text over the alphabet.
    """
    specials = [_SPECIAL["pad"], _SPECIAL["eos"], _SPECIAL["bos"], _SPECIAL["unk"]]
    vocab = {tok: i for i, tok in enumerate(specials + list(ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_SPECIAL["unk"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=_SPECIAL["eos"],
        bos_token=_SPECIAL["bos"],
        unk_token=_SPECIAL["unk"],
        pad_token=_SPECIAL["pad"] if with_pad else None,
        padding_side="left",
    )
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    seed: int = 0,
    initializer_range: float = 0.1,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2-architecture causal LM sized for CPU tests.

    Args:
        tokenizer: Its vocabulary size and special tokens configure the model.
        hidden_size: Model width.
        num_layers: Number of decoder layers.
        num_heads: Attention heads.
        num_kv_heads: Key/value heads (grouped-query attention, as in Qwen2.5).
        intermediate_size: MLP width; defaults to ``4 * hidden_size``.
        max_position_embeddings: Longest sequence the rotary embedding is configured for.
        seed: Seed for the random initialisation, so the same call gives the same weights.
        initializer_range: Std of the random weights. Larger than transformers' 0.02 so that the tied embeddings can
            express a peaked next-token distribution (with 0.02 the largest reachable logit gap is about 1).

    Returns:
        The model in float32.
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model
