"""A tiny chat model that calls a tool, nameable in YAML: the calculator examples' warmed policy, cached.

``examples/tool_calling.py`` warms its tiny policy in code (:func:`~lightning_grpo.testing.calculator.warm_policy`); a
config runs no code, so :class:`TinyToolModel` is that policy as a class: warmed on first use (under a minute on one
core), then read from :func:`~lightning_grpo.testing.tiny_model.tiny_cache_dir`, as :class:`TinyModel` is. Its
tokenizer is :class:`~lightning_grpo.testing.TinyToolTokenizer` (the tiny chat template, tools listed by name).

What it learned in its warm-up, and so what a user's environment must offer it: prompts ``"a+b?"`` (one user message,
one-digit ``a`` and ``b``), **one tool named** ``add`` **with integer arguments** ``a`` **and** ``b``, called as
``<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>`` in about a fifth of its answers (the others
guess a number). GRPO makes the call a habit when the reward pays for it. In a YAML config::

    model:
      class_path: lightning_grpo.GRPOModule
      init_args:
        model:
          class_path: lightning_grpo.testing.TinyToolModel
          init_args:
            seed: 0
        tokenizer:
          class_path: lightning_grpo.testing.TinyToolTokenizer
        environment_factory: my_env.Calculator  # offers add(a, b) as a tool

``examples/own_environment/`` trains a TRL-style environment class this way from the command line (docs/agents.md,
"Your own environment from YAML").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from lightning_grpo.testing.agents import add_records, warm_up_tool_use
from lightning_grpo.testing.calculator import CALL_FRACTION, ROWS, WARMUP_STEPS
from lightning_grpo.testing.tiny_model import load_or_warm, tiny_cache_dir, tiny_config
from lightning_grpo.testing.tokenizer import TinyToolTokenizer

__all__ = ["TinyToolModel"]

_RECIPE_VERSION = 1  # bump when the warm-up changes, so cached weights are rebuilt


class TinyToolModel(Qwen2ForCausalLM):
    """The calculator examples' tiny policy (2 layers, 64 wide), warmed on tool-call traces, as a loadable class.

    The same weights as :func:`~lightning_grpo.testing.calculator.warm_policy` gives ``examples/tool_calling.py`` for
    the same ``seed``, ``call_fraction`` and ``warmup_steps``. Loading gives it no special treatment: it is a
    ``Qwen2ForCausalLM``. Pair it with :class:`~lightning_grpo.testing.TinyToolTokenizer`.

    Args:
        seed: Seed of the initial weights, of the warm-up's rows (``"a+b?"``) and of its data order.
        call_fraction: Fraction in ``[0, 1]`` of the warm-up's traces that call ``add``: the policy's prior.
        warmup_steps: Supervised steps (16 traces each).
        cache_dir: Folder of cached warm-ups; defaults to :func:`~lightning_grpo.testing.tiny_model.tiny_cache_dir`.

    Raises:
        ValueError: ``call_fraction`` is outside ``[0, 1]`` or ``warmup_steps`` is negative.
    """

    def __init__(
        self,
        seed: int = 0,
        call_fraction: float = CALL_FRACTION,
        warmup_steps: int = WARMUP_STEPS,
        cache_dir: str | None = None,
    ) -> None:
        if not 0.0 <= call_fraction <= 1.0:
            raise ValueError(
                f"call_fraction must be in [0, 1] (a fraction of the warm-up's traces), got {call_fraction}"
            )
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0 (supervised steps), got {warmup_steps}")
        tokenizer = TinyToolTokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__(tiny_config(tokenizer))
        self.loss_type = "ForCausalLM"  # transformers finds no loss in the class name and would log that it guessed
        recipe = {"seed": seed, "call_fraction": call_fraction, "steps": warmup_steps, "rows": ROWS}
        path = Path(cache_dir or tiny_cache_dir()) / f"tiny-calculator-{_fingerprint(recipe)}"
        announcement = (
            f"tiny tool model: warming up on tool-call traces ({warmup_steps} supervised steps; under a minute"
        )

        def warm() -> None:
            rows = add_records(ROWS, seed=seed)
            warm_up_tool_use(self, tokenizer, rows, call_fraction=call_fraction, steps=warmup_steps, seed=seed)

        load_or_warm(self, path, announcement, warm)


def _fingerprint(recipe: dict[str, float]) -> str:
    """A short hash of the warm-up's recipe: the name of the cached weights."""
    text = json.dumps({"task": "calculator", "version": _RECIPE_VERSION, **recipe}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
