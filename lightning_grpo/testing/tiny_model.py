"""Tiny Qwen2-architecture models built in code, for tests and the offline demo.

Nothing here touches the network: the model is a randomly initialised decoder built from a config, sized for CPU
tests. :class:`TinyModel` ``(task)`` is such a model *warmed up* on the built-in task ``task`` (see
:mod:`lightning_grpo.testing.tasks`): half a minute of supervised pre-training on noisy answers leaves it right about
30% of the time, which GRPO then sharpens. The warmed-up weights are cached (see :func:`tiny_cache_dir`);
``task="random"`` is the model without warm-up. In a YAML config::

    model:
      class_path: lightning_grpo.testing.TinyModel
      init_args: {task: addition}
    tokenizer:
      class_path: lightning_grpo.testing.TinyTokenizer

Example::

    from lightning_grpo.testing import TinyModel, build_tiny_model, build_tiny_tokenizer

    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=64, num_layers=2)  # random weights
    warm = TinyModel("successor")  # warmed up (or read from the cache)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from lightning_grpo.testing.progress import StepProgress
from lightning_grpo.testing.tasks import make_task
from lightning_grpo.testing.tokenizer import build_tiny_tokenizer

__all__ = [
    "RANDOM",
    "TinyModel",
    "WarmupSettings",
    "build_tiny_model",
    "load_or_warm",
    "load_tiny_model",
    "tiny_cache_dir",
    "tiny_config",
    "warm_up",
]

#: The task name of the tiny model without warm-up.
RANDOM = "random"
_RECIPE_VERSION = 1  # bump when the warm-up recipe changes, so cached weights are rebuilt


def tiny_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    initializer_range: float = 0.1,
) -> Qwen2Config:
    """The config of a tiny Qwen2-architecture model over ``tokenizer`` (arguments as :func:`build_tiny_model`)."""
    return Qwen2Config(
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


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
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
    config = tiny_config(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


@dataclass(frozen=True)
class WarmupSettings:
    """The tiny model's size and its warm-up (supervised pre-training) on a built-in task.

    The warm-up is next-token cross-entropy on ``prompt + answer + <eos>``, with the loss on the answer and EOS only.
    Each answer shown is the right one with probability ``label_accuracy`` and otherwise the answer of another random
    record of the task, so the model learns the format and puts roughly ``label_accuracy`` of its probability on the
    right answer: a base model that is right some of the time, as pre-trained models are, for GRPO to sharpen.

    Attributes:
        hidden_size: Model width.
        num_layers: Decoder layers.
        num_heads: Attention heads (``hidden_size / num_heads`` is the head size: vLLM's CPU kernels need 32 or more).
        steps: Optimizer steps of the warm-up.
        batch_size: Sequences per step, drawn with replacement from the task's records.
        lr: Peak AdamW learning rate (linear warm-up over 50 steps, then linear decay to 0).
        label_accuracy: Probability that a shown answer is the right one.
        seed: Seed of the initial weights and of the data order.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 500
    batch_size: int = 128
    lr: float = 3e-3
    label_accuracy: float = 0.3
    seed: int = 0

    def fingerprint(self, task: str) -> str:
        """A short hash of the task and settings: the name of the cached weights."""
        fields = asdict(self)
        if fields["num_heads"] == 4:  # the shape every cached warm-up had before num_heads was a setting
            del fields["num_heads"]
        text = json.dumps({"task": task, "recipe": _RECIPE_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def tiny_cache_dir() -> Path:
    """The folder of the cached warm-ups.

    ``$LIGHTNING_GRPO_CACHE`` if set, else ``$XDG_CACHE_HOME/lightning_grpo``, else ``~/.cache/lightning_grpo``.
    """
    if os.environ.get("LIGHTNING_GRPO_CACHE"):
        return Path(os.environ["LIGHTNING_GRPO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning_grpo"


class TinyModel(Qwen2ForCausalLM):
    """The tiny model warmed up on a built-in task, built in code: the policy of the demo and of the CLI tests.

    The weights are those of :func:`build_tiny_model` (same ``hidden_size``, ``num_layers``, ``seed``) after
    :func:`warm_up` with :class:`WarmupSettings` of those values, read from :func:`tiny_cache_dir` when cached there;
    the first use of a task and settings trains (about half a minute on two CPU cores) and saves. Loading the policy
    gives it no special treatment: it is a ``Qwen2ForCausalLM``. Pair it with
    :class:`~lightning_grpo.testing.TinyTokenizer`.

    Args:
        task: A built-in task (``"addition"``, ``"successor"``, see :data:`~lightning_grpo.testing.BUILTIN_TASKS`), or
            ``"random"`` for the model without warm-up.
        hidden_size: Model width.
        num_layers: Decoder layers.
        seed: Seed of the initial weights and of the warm-up's data order.
        num_heads: Attention heads (2 gives the head size of 32 that vLLM's CPU kernels need).
        cache_dir: Folder of cached warm-ups; defaults to :func:`tiny_cache_dir`.

    Raises:
        ValueError: ``task`` is neither ``"random"`` nor a built-in task; the message lists the valid tasks.
    """

    def __init__(
        self,
        task: str = RANDOM,
        hidden_size: int = 64,
        num_layers: int = 2,
        seed: int = 0,
        cache_dir: str | None = None,
        num_heads: int = 4,
    ) -> None:
        tokenizer = build_tiny_tokenizer()
        config = tiny_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__(config)
        self.loss_type = "ForCausalLM"  # transformers finds no loss in the class name and would log that it guessed
        settings = WarmupSettings(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, seed=seed)
        _warm_or_load(self, task, settings, cache_dir)
        self.task = task


def load_tiny_model(
    task: str, *, settings: WarmupSettings | None = None, cache_dir: str | Path | None = None
) -> Qwen2ForCausalLM:
    """The tiny model warmed up on the built-in task ``task`` with any :class:`WarmupSettings` (cached), in float32.

    :class:`TinyModel` is this with the default recipe; here every setting (steps, batch size, ...) can change.

    Args:
        task: A key of :data:`~lightning_grpo.testing.BUILTIN_TASKS`, or ``"random"`` for the model without warm-up.
        settings: Model size and warm-up recipe; defaults to :class:`WarmupSettings` ``()``.
        cache_dir: Folder of cached warm-ups; defaults to :func:`tiny_cache_dir`.

    Returns:
        The model, in train mode, on the CPU.

    Raises:
        ValueError: ``task`` names no built-in task.
    """
    settings = settings or WarmupSettings()
    model = build_tiny_model(
        build_tiny_tokenizer(),
        hidden_size=settings.hidden_size,
        num_layers=settings.num_layers,
        num_heads=settings.num_heads,
        seed=settings.seed,
    )
    return _warm_or_load(model, task, settings, cache_dir)


def _warm_or_load(
    model: Qwen2ForCausalLM, task: str, settings: WarmupSettings, cache_dir: str | Path | None
) -> Qwen2ForCausalLM:
    """Give ``model`` (freshly built from ``settings``) the cached warm-up for ``task``, training it if not cached."""
    if task == RANDOM:
        return model.train()
    records = make_task(task)  # raises on an unknown task, naming the valid ones
    path = Path(cache_dir or tiny_cache_dir()) / f"tiny-{task}-{settings.fingerprint(task)}"
    announcement = f"tiny model: warming up on {task} ({settings.steps} supervised steps; about a minute on 2 cores"
    return load_or_warm(model, path, announcement, lambda: warm_up(model, build_tiny_tokenizer(), records, settings))


def load_or_warm(
    model: Qwen2ForCausalLM, path: Path, announcement: str, warm: Callable[[], object]
) -> Qwen2ForCausalLM:
    """Load ``model``'s weights from the cached ``path``, or run ``warm()`` (which trains ``model`` in place) and save.

    Args:
        model: The freshly built model.
        path: The cached copy's folder (written atomically: concurrent warm-ups never leave half a model).
        announcement: What the warm-up does and about how long it takes, printed to stderr before it starts.
        warm: Trains ``model`` in place.

    Returns:
        ``model``, in train mode.
    """
    if (path / "config.json").exists():
        with _quiet_progress_bars():
            model.load_state_dict(Qwen2ForCausalLM.from_pretrained(str(path)).state_dict())
        return model.train()
    print(f"{announcement}, once: cached in {path.parent})", file=sys.stderr, flush=True)  # the silence has a reason
    warm()
    _save_atomically(model, path)
    return model.train()


def warm_up(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
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
        progress = StepProgress("tiny model: warm-up", settings.steps)
        for step in range(settings.steps):
            progress.step(step)
            rows = [rng.choice(records) for _ in range(settings.batch_size)]
            shown = [row["answer"] if rng.random() < settings.label_accuracy else rng.choice(answers) for row in rows]
            batch = _answer_batch(tokenizer, [row["prompt"] for row in rows], shown)
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
    return model


def _answer_batch(tokenizer: PreTrainedTokenizerBase, prompts: list[str], answers: list[str]) -> dict[str, Any]:
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
