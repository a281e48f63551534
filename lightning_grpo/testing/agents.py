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

import random
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from lightning_grpo.agents import EnvStep, HermesToolCallParser, ToolSet, assistant_message
from lightning_grpo.rollout.chat import continuation_ids, render_messages
from lightning_grpo.testing.progress import StepProgress
from lightning_grpo.testing.tiny_model import build_tiny_model
from lightning_grpo.testing.tokenizer import TinyToolTokenizer

__all__ = [
    "CountdownEnv",
    "add",
    "add_records",
    "called_add_right",
    "short_turn_model",
    "tool_name_tokenizer",
    "tool_trace",
    "warm_up_on_traces",
    "warm_up_tool_use",
]


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


def tool_name_tokenizer() -> TinyToolTokenizer:
    """The tiny tokenizer with a chat template that lists tools by name only (short prompts for learning tests):
    a :class:`~lightning_grpo.testing.tokenizer.TinyToolTokenizer`."""
    return TinyToolTokenizer()


def add_records(num: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"prompt": [user message "a+b?"], "a": a, "b": b}`` with one-digit ``a`` and ``b``."""
    rng = random.Random(seed)
    rows = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(num)]
    return [{"prompt": [{"role": "user", "content": f"{a}+{b}?"}], "a": a, "b": b} for a, b in rows]


def called_add_right(completions: list[list[dict[str, Any]]], a: list[int], b: list[int], **_: Any) -> list[float]:
    """Reward: 1.0 when the trajectory holds a tool message with the row's sum (``add`` was called with its numbers)."""
    return [
        float(any(m["role"] == "tool" and m["content"].strip() == str(x + y) for m in messages))
        for messages, x, y in zip(completions, a, b, strict=True)
    ]


def tool_trace(
    tokenizer: PreTrainedTokenizerBase, row: dict[str, Any], *, call: bool, guess: str = "0"
) -> tuple[list[int], list[int]]:
    """Token ids and labels of one conversation laid out as a rollout lays it out (tools: ``[add]``).

    With ``call``, the assistant calls ``add`` with the row's numbers and copies the result; otherwise it answers
    ``guess``. Labels are the ids on the assistant's tokens and ``-100`` on the prompt and the tool's tokens.
    """
    tools = ToolSet([add]).schemas
    ids = tokenizer(render_messages(tokenizer, row["prompt"], tools=tools), add_special_tokens=False)["input_ids"]
    labels = [-100] * len(ids)
    call_text = f'<tool_call>{{"name": "add", "arguments": {{"a": {row["a"]}, "b": {row["b"]}}}}}</tool_call>'
    history = list(row["prompt"])
    for content in [call_text, str(row["a"] + row["b"])] if call else [guess]:
        sampled = [*tokenizer(content, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        ids, labels = ids + sampled, labels + sampled
        history.append(assistant_message(HermesToolCallParser().parse(content)))
        if content == call_text:
            result = [{"role": "tool", "name": "add", "content": str(add(row["a"], row["b"]))}]
            inserted = continuation_ids(tokenizer, history, result, tools=tools)
            ids, labels, history = ids + inserted, labels + [-100] * len(inserted), history + result
    return ids, labels


def warm_up_tool_use(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    call_fraction: float = 0.3,
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """Supervised warm-up on :func:`tool_trace` conversations: ``call_fraction`` of them call ``add``.

    The others answer a random one-digit guess, so the warm model calls the tool about ``call_fraction`` of the time:
    a policy that sometimes uses its tool, for GRPO to make it a habit. Deterministic for a given ``seed``.
    """
    rng = random.Random(seed)

    def trace() -> tuple[list[int], list[int]]:
        row, call = rng.choice(rows), rng.random() < call_fraction
        return tool_trace(tokenizer, row, call=call, guess=str(rng.randint(2, 18)))

    return warm_up_on_traces(model, tokenizer, trace, steps=steps, batch_size=batch_size, lr=lr, seed=seed)


def warm_up_on_traces(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    trace: Callable[[], tuple[list[int], list[int]]],
    *,
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """Supervised steps on conversations from ``trace()`` (token ids, and labels that are ``-100`` off the policy).

    Used to warm-start tiny models for agent examples and learning tests; deterministic for a given ``trace`` and
    ``seed``.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        progress = StepProgress("warm-up", steps)
        for step in range(steps):
            progress.step(step)
            traces = [trace() for _ in range(batch_size)]
            width = max(len(ids) for ids, _ in traces)
            input_ids = torch.full((batch_size, width), tokenizer.pad_token_id)
            labels = torch.full((batch_size, width), -100)
            mask = torch.zeros((batch_size, width), dtype=torch.long)
            for i, (ids, target) in enumerate(traces):
                input_ids[i, : len(ids)], labels[i, : len(ids)] = torch.tensor(ids), torch.tensor(target)
                mask[i, : len(ids)] = 1
            model(input_ids=input_ids, attention_mask=mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model
