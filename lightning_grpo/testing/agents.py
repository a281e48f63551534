"""Agent fixtures for tests: a tiny model that ends its turns early, an environment with a set number of turns, a
scripted tool-calling policy's texts, and a documented calculator tool.

Example::

    from lightning_grpo.testing import build_tiny_tokenizer
    from lightning_grpo.testing.agents import CountdownEnv, short_turn_model

    tokenizer = build_tiny_tokenizer()
    model = short_turn_model(tokenizer)  # P(EOS) raised, so random turns are a few tokens long
    env = CountdownEnv({"turns": 2})  # "again" after the first turn, done after the second
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from lightning_grpo.agents import EnvStep
from lightning_grpo.testing.model import build_tiny_model

__all__ = ["CountdownEnv", "add", "short_turn_model"]


def short_turn_model(tokenizer: PreTrainedTokenizerBase, *, eos_bias: float = 4.0, seed: int = 0) -> Qwen2ForCausalLM:
    """A random tiny model whose output head has a bias raising the EOS logit by ``eos_bias``.

    Its turns end after a few tokens, so multi-turn rollouts of a random model have several turns within a small
    token budget. The head keeps the tied embedding weight (the bias is a plain head parameter, not LoRA-adapted).
    """
    model = build_tiny_model(tokenizer, seed=seed)
    weight = model.get_output_embeddings().weight
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    head.weight = weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = eos_bias
    model.lm_head = head
    return model


class CountdownEnv:
    """An environment that lasts ``row["turns"]`` policy turns; each turn's reward is its content's length.

    Observations are ``"again"`` (a user message) until the last turn, which ends the episode.
    """

    def __init__(self, row: dict[str, Any]) -> None:
        self.left = int(row["turns"])

    def reset(self) -> None:
        """No first observation: the prompt is the task."""
        return None

    def step(self, message: dict[str, Any]) -> EnvStep:
        """Count the turn down; the reward is the length of the assistant's content."""
        self.left -= 1
        done = self.left <= 0
        return EnvStep(observation=None if done else "again", reward=float(len(message["content"])), done=done)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b
