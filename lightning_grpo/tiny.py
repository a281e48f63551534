"""Tiny models and tokenizers built in code, for tests and the offline demo.

Nothing here touches the network: the tokenizer is character-level and built from a fixed alphabet, and the model is
a randomly initialised Qwen2-architecture decoder built from a config.

A model name ``"tiny:<task>"`` (accepted as the model of :class:`~lightning_grpo.GRPOModule` and
:func:`~lightning_grpo.policy.load_policy`, e.g. ``model: tiny:addition`` in a YAML config, which also gets the tiny
tokenizer) names such a model *warmed up* on the built-in task ``<task>``: half a minute of supervised pre-training on
noisy answers leaves it right about 30% of the time, which GRPO then sharpens.
The warmed-up weights are cached (see :func:`tiny_cache_dir`). ``"tiny:random"`` is the model without warm-up.

Example::

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
    warm = load_tiny_model("tiny:successor")  # warmed up (or read from the cache)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import string
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

__all__ = [
    "ALPHABET",
    "TINY_PREFIX",
    "WarmupSettings",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "is_tiny_name",
    "load_tiny_model",
    "tiny_cache_dir",
    "warm_up",
]

#: Prefix of the model names that :func:`load_tiny_model` builds in code: ``"tiny:<task>"`` or ``"tiny:random"``.
TINY_PREFIX = "tiny:"
_RANDOM = "random"
_RECIPE_VERSION = 1  # bump when the warm-up recipe changes, so cached weights are rebuilt

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


def is_tiny_name(name: Any) -> bool:
    """Whether ``name`` is a tiny model name (``"tiny:<task>"`` or ``"tiny:random"``)."""
    return isinstance(name, str) and name.startswith(TINY_PREFIX)


@dataclass(frozen=True)
class WarmupSettings:
    """The tiny model of a ``"tiny:<task>"`` name and its warm-up (supervised pre-training) on the task.

    The warm-up is next-token cross-entropy on ``prompt + answer + <eos>``, with the loss on the answer and EOS only.
    Each answer shown is the right one with probability ``label_accuracy`` and otherwise the answer of another random
    record of the task, so the model learns the format and puts roughly ``label_accuracy`` of its probability on the
    right answer: a base model that is right some of the time, as pre-trained models are, for GRPO to sharpen.

    Attributes:
        hidden_size: Model width.
        num_layers: Decoder layers.
        steps: Optimizer steps of the warm-up.
        batch_size: Sequences per step, drawn with replacement from the task's records.
        lr: Peak AdamW learning rate (linear warm-up over 50 steps, then linear decay to 0).
        label_accuracy: Probability that a shown answer is the right one.
        seed: Seed of the initial weights and of the data order.
    """

    hidden_size: int = 64
    num_layers: int = 2
    steps: int = 500
    batch_size: int = 128
    lr: float = 3e-3
    label_accuracy: float = 0.3
    seed: int = 0

    def fingerprint(self, task: str) -> str:
        """A short hash of the task and settings: the name of the cached weights."""
        text = json.dumps({"task": task, "recipe": _RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def tiny_cache_dir() -> Path:
    """The folder of the cached warm-ups.

    ``$LIGHTNING_GRPO_CACHE`` if set, else ``$XDG_CACHE_HOME/lightning_grpo``, else ``~/.cache/lightning_grpo``.
    """
    if os.environ.get("LIGHTNING_GRPO_CACHE"):
        return Path(os.environ["LIGHTNING_GRPO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning_grpo"


def load_tiny_model(
    name: str, *, settings: WarmupSettings | None = None, cache_dir: str | Path | None = None
) -> Qwen2ForCausalLM:
    """The tiny model a ``"tiny:<task>"`` name stands for, warmed up on the built-in task (cached), in float32.

    Args:
        name: ``"tiny:<task>"`` with ``<task>`` a key of :data:`~lightning_grpo.data.tasks.BUILTIN_TASKS`, or
            ``"tiny:random"`` for the model without warm-up.
        settings: Model size and warm-up recipe; defaults to :class:`WarmupSettings` ``()``.
        cache_dir: Folder of cached warm-ups; defaults to :func:`tiny_cache_dir`. The first call for a task and
            settings trains (about half a minute on two CPU cores) and saves there; later calls load.

    Returns:
        The model, in train mode, on the CPU.

    Raises:
        ValueError: ``name`` is not a tiny name or names no built-in task.
    """
    if not is_tiny_name(name):
        raise ValueError(f"{name!r} is not a tiny model name; write '{TINY_PREFIX}<task>' or '{TINY_PREFIX}{_RANDOM}'")
    task, settings = name[len(TINY_PREFIX) :], settings or WarmupSettings()
    tokenizer = build_tiny_tokenizer()
    if task == _RANDOM:
        return build_tiny_model(
            tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, seed=settings.seed
        )
    from lightning_grpo.data.tasks import make_task  # lazy: keeps this module free of the data package

    records = make_task(task)  # the records of "builtin:<task>"; raises on an unknown task
    path = Path(cache_dir or tiny_cache_dir()) / f"tiny-{task}-{settings.fingerprint(task)}"
    if (path / "config.json").exists():
        with _quiet_progress_bars():
            return Qwen2ForCausalLM.from_pretrained(str(path)).train()
    model = build_tiny_model(
        tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, seed=settings.seed
    )
    warm_up(model, tokenizer, records, settings)
    _save_atomically(model, path)
    return model


def warm_up(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    records: list[dict[str, Any]],
    settings: WarmupSettings,
) -> Qwen2ForCausalLM:
    """Pre-train ``model`` in place on ``records`` (``prompt``/``answer`` strings) with noisy answers.

    Deterministic for given settings: the data order comes from a private generator seeded with ``settings.seed``
    and the global random state is left as it was.

    Returns:
        The same model, in train mode.
    """
    rng = random.Random(settings.seed)
    answers = [row["answer"] for row in records]
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    warmup = min(50, settings.steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.0, 1.0 - step / settings.steps)
    )
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        for _ in range(settings.steps):
            rows = [rng.choice(records) for _ in range(settings.batch_size)]
            shown = [row["answer"] if rng.random() < settings.label_accuracy else rng.choice(answers) for row in rows]
            batch = _answer_batch(tokenizer, [row["prompt"] for row in rows], shown)
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
    return model


def _answer_batch(tokenizer: PreTrainedTokenizerFast, prompts: list[str], answers: list[str]) -> dict[str, Any]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (``-100`` except on answer and EOS tokens)."""
    encode = lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = [(p, [*a, tokenizer.eos_token_id]) for p, a in zip(encode(prompts), encode(answers), strict=True)]
    width = max(len(p) + len(a) for p, a in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, answer) in enumerate(rows):
        n = len(prompt) + len(answer)
        input_ids[i, :n] = torch.tensor(prompt + answer)
        labels[i, len(prompt) : n] = torch.tensor(answer)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _save_atomically(model: Qwen2ForCausalLM, path: Path) -> None:
    """Save to a temporary folder beside ``path``, then rename: concurrent writers never leave half a model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        with _quiet_progress_bars():
            model.save_pretrained(str(staging))
        os.replace(staging, path)
    except OSError:
        if not (path / "config.json").exists():  # another process won the race only if its copy is complete
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Hide transformers' progress bars (saving and loading a one-file model needs none), then restore them."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
