"""Tool calling: GRPO teaches a policy to call a calculator instead of guessing (see ``docs/agents.md``).

Each prompt asks for a sum of two two-digit numbers (``"37+48?"``). A 2-layer, 64-wide model cannot add them, but it
can call the ``calc`` tool, read the tool's result and copy it as its answer::

    U: 37+48?
    A: <tool_call>{"name": "calc", "arguments": {"expression": "37+48"}}</tool_call>
    T: 85
    A: 85

The reward is 1.0 for the right final answer. The tiny model is first warmed up for a few seconds on noisy traces (a
third call the tool, the others guess a number), so it starts right about a third of the time; GRPO then makes the
tool call the habit. The warm weights are cached under ``~/.cache/lightning_grpo`` (``$LIGHTNING_GRPO_CACHE``).

    python examples/tool_calling.py                     # tiny model, CPU, offline: about two minutes
    python examples/tool_calling.py --max-steps 10      # shorter

The last line reads ``tool_calling: mean reward A -> B over N steps (S s)``: the mean reward of the first and the last
tenth of the iterations. With a real model, the same ``calc`` works from a YAML config run from the repository root
(``configs/qwen2.5-0.5b/tool-calling-lora.yaml`` names it ``examples.tool_calling.calc``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import operator
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.agents import HermesToolCallParser, ToolSet, assistant_message
from lightning_grpo.rollout.chat import continuation_ids
from lightning_grpo.testing import TinyTokenizer, build_tiny_model, tiny_cache_dir
from lightning_grpo.testing.demo import read_rewards, summarize

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, +, -, *, / and parentheses.

    Args:
        expression: The expression, for example "37+48" or "(2+3)*4".
    """

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"calc only reads numbers, + - * / and parentheses, not {ast.unparse(node)!r}")

    result = value(ast.parse(expression.strip(), mode="eval").body)
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def final_answer(completions: list[list[dict[str, Any]]], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the last assistant message (one that calls no tool) is the expected answer, else 0.0."""
    rewards = []
    for messages, expected in zip(completions, answer, strict=True):
        last = messages[-1] if messages else {}
        done = last.get("role") == "assistant" and not last.get("tool_calls")
        rewards.append(float(done and (last.get("content") or "").strip() == expected))
    return rewards


# A short version of the tiny chat template (lightning_grpo/testing/chat_template.py): tools are listed by name only,
# because a full JSON schema would triple the tiny model's sequences. Real models render full schemas.
TEMPLATE = (
    "{% if tools %}S:{{ '\\n' }}Tools: {{ tools | map(attribute='function.name') | join(', ') }}<eos>{{ '\\n' }}"
    "{% endif %}{% for message in messages %}"
    "{% if message.role == 'user' %}U:{{ '\\n' }}{{ message.content }}<eos>{{ '\\n' }}"
    "{% elif message.role == 'assistant' %}A:{{ '\\n' }}{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<eos>{{ '\\n' }}"
    "{% elif message.role == 'tool' %}T:{{ '\\n' }}{{ message.content }}<eos>{{ '\\n' }}"
    "{% else %}{{ raise_exception('unsupported role ' ~ message.role) }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{{ '\\n' }}{% endif %}"
)


def make_tokenizer() -> TinyTokenizer:
    """The tiny character-level tokenizer with :data:`TEMPLATE` as its chat template."""
    tokenizer = TinyTokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def make_records(num: int = 256, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"prompt": [user message "a+b?"], "answer": "a+b"}`` with two-digit ``a``, ``b`` from 10 to 49."""
    rng = random.Random(seed)
    pairs = [(rng.randint(10, 49), rng.randint(10, 49)) for _ in range(num)]
    return [{"prompt": [{"role": "user", "content": f"{a}+{b}?"}], "answer": str(a + b)} for a, b in pairs]


def trace(
    tokenizer: PreTrainedTokenizerBase, record: dict[str, Any], *, call: bool, guess: str
) -> tuple[list[int], list[int]]:
    """Token ids and labels of one warm-up conversation, laid out exactly as the rollout lays out its tokens.

    With ``call``, the assistant calls ``calc`` and then copies the tool's result; otherwise it answers ``guess``.
    Labels are the ids on the assistant's tokens and ``-100`` on the prompt and the tool's tokens (context).
    """
    tools = ToolSet([calc]).schemas
    text = tokenizer.apply_chat_template(record["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    labels = [-100] * len(ids)
    expression = record["prompt"][0]["content"].rstrip("?")
    call_text = f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
    turns = [call_text, record["answer"]] if call else [guess]
    history = list(record["prompt"])
    for content in turns:
        sampled = [*tokenizer(content, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        ids, labels = ids + sampled, labels + sampled
        history.append(assistant_message(HermesToolCallParser().parse(content)))
        if content == call_text:
            result = [{"role": "tool", "name": "calc", "content": calc(expression)}]
            inserted = continuation_ids(tokenizer, history, result, tools=tools)
            ids, labels = ids + inserted, labels + [-100] * len(inserted)
            history += result
    return ids, labels


def warm_model(options: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> Qwen2ForCausalLM:
    """The tiny model after a supervised pass on noisy traces (read from the cache when it was done before).

    A fraction ``options.call_fraction`` of the traces call the tool; the others answer a random sum directly.
    """
    recipe = {"version": 1, "template": TEMPLATE, **{k: getattr(options, k) for k in _WARMUP_OPTIONS}}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = tiny_cache_dir() / f"tool-calling-{digest}"
    model = build_tiny_model(tokenizer, seed=options.seed)
    if (path / "config.json").exists():
        model.load_state_dict(Qwen2ForCausalLM.from_pretrained(str(path)).state_dict())
        return model
    rng = random.Random(options.seed)
    records = make_records(1024, seed=options.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.warmup_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / options.warmup_steps)
    for _ in range(options.warmup_steps):
        rows = [rng.choice(records) for _ in range(options.warmup_batch_size)]
        traces = [trace(tokenizer, row, call=rng.random() < options.call_fraction, guess=str(rng.randint(20, 98)))
                  for row in rows]  # fmt: skip
        model(**_padded(traces, tokenizer.pad_token_id)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
    _save(model, path)
    return model


_WARMUP_OPTIONS = ("warmup_steps", "warmup_batch_size", "warmup_lr", "call_fraction", "seed")


def _padded(traces: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` of warm-up traces."""
    width = max(len(ids) for ids, _ in traces)
    batch = {"input_ids": torch.full((len(traces), width), pad_id), "labels": torch.full((len(traces), width), -100)}
    batch["attention_mask"] = torch.zeros((len(traces), width), dtype=torch.long)
    for row, (ids, labels) in enumerate(traces):
        batch["input_ids"][row, : len(ids)] = torch.tensor(ids)
        batch["labels"][row, : len(ids)] = torch.tensor(labels)
        batch["attention_mask"][row, : len(ids)] = 1
    return batch


def _save(model: Qwen2ForCausalLM, path: Path) -> None:
    """Save to a temporary folder beside ``path``, then rename it (a concurrent run never reads half a model)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(str(staging))
        os.replace(staging, path)
    except OSError:
        if not (path / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build(options: argparse.Namespace) -> tuple[GRPOModule, PromptDataModule, Trainer]:
    """The module (the ``calc`` tool, the final-answer reward), the data module and the trainer."""
    tokenizer = make_tokenizer()
    module = GRPOModule(
        warm_model(options, tokenizer),
        [final_answer],
        tokenizer=tokenizer,
        tools=[calc],
        policy=PolicyConfig(lora_r=16, lora_alpha=32, dtype="float32"),
        grpo=GRPOConfig(
            num_generations=options.num_generations, max_turns=3, max_new_tokens=96, max_prompt_length=32,
            kl_coef=0.0, loss_agg_mode="token-mean",
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0),
        seed=options.seed,
    )  # fmt: skip
    data = PromptDataModule(make_records(seed=options.seed), batch_size=options.batch_size, seed=options.seed)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=options.max_steps,
        log_every_n_steps=1,
        logger=CSVLogger(options.output_dir, name="tool_calling"),
        enable_checkpointing=False,
        enable_progress_bar=options.progress_bar,
        enable_model_summary=False,
    )
    return module, data, trainer


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults run in about two minutes on two CPU cores."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=40, help="GRPO iterations")
    parser.add_argument("--num-generations", type=int, default=8, help="G, trajectories per prompt")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per iteration")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup-steps", type=int, default=300, help="supervised steps on noisy traces")
    parser.add_argument("--warmup-batch-size", type=int, default=32)
    parser.add_argument("--warmup-lr", type=float, default=3e-3)
    parser.add_argument("--call-fraction", type=float, default=0.3, help="fraction of warm-up traces calling calc")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> tuple[float, float, int]:
    """Warm up (or load), train, and print the mean reward of the first and last tenth of the iterations."""
    start = time.perf_counter()
    options = parse(argv)
    torch.set_num_threads(1)  # tiny models run fastest on one thread
    torch.manual_seed(options.seed)
    module, data, trainer = build(options)
    trainer.fit(module, data)
    rewards = read_rewards(Path(trainer.logger.log_dir) / "metrics.csv")
    first, last = summarize(rewards)
    seconds = time.perf_counter() - start
    print(f"tool_calling: mean reward {first:.2f} -> {last:.2f} over {len(rewards)} steps ({seconds:.0f} s)")
    return first, last, len(rewards)


if __name__ == "__main__":
    main()
