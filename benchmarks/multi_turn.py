"""Multi-turn rollout cost: a 3-turn tool task against the same number of sampled tokens in one turn.

Both rollouts sample from the same model through the same conversational path
(:func:`~lightning_grpo.rollout.multi_turn.generate_conversations`), with the tool schema in the prompt. A scripted
output head makes the trajectories exact: the model's logits are computed as usual (so every forward costs what it
costs), then all but the script's next token are masked. The 3-turn task calls ``add`` twice, each result coming
back as a tool message, then answers; the 1-turn baseline samples as many tokens (the same count, EOS included) in
one turn. The difference is the price of the turns: a prefill of the whole context per turn, the tool calls and the
chat-template rendering of their results (``docs/agents.md``, speed; figures in ``docs/benchmarks.md``).

    python -m benchmarks.multi_turn                                   # CUDA if available, else CPU
    python -m benchmarks.multi_turn --hidden-size 64 --layers 2 --prompts 2 --generations 2 --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.generation import SamplingSettings
from lightning_grpo.rollout.multi_turn import AgentSettings, generate_conversations
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from lightning_grpo.testing.agents import add

__all__ = ["Measurement", "ScriptedHead", "main", "measure", "scripts"]

_CALLS = ((31, 24), (55, 17))  # two calls to add; the answer is the last result


@dataclass(frozen=True)
class Measurement:
    """One rollout kind: its median time and what each trajectory held."""

    name: str
    seconds: float
    prompt_tokens: float
    turns: float
    sampled_tokens: float
    context_tokens: float
    trajectories: int

    @property
    def tokens_per_second(self) -> float:
        """Sampled tokens of the whole rollout per second."""
        return self.sampled_tokens * self.trajectories / self.seconds


class ScriptedHead:
    """Hooks that force a model to emit a script: one token list per ``generate`` call (one call per turn).

    Each forward inside ``generate`` emits the next token of that turn's script (a prefill outside ``generate``, the
    shared prompt prefix of turn 0, emits nothing). The logits are computed first, so the cost is the model's own.
    """

    def __init__(self, model: nn.Module, turns: Sequence[Sequence[int]]) -> None:
        self.turns = [list(t) for t in turns]
        self.turn, self.step, self._generating = -1, 0, False
        generate = model.generate

        def scripted_generate(*args: Any, **kwargs: Any) -> Any:
            self.turn, self.step, self._generating = self.turn + 1, 0, True
            try:
                return generate(*args, **kwargs)
            finally:
                self._generating = False

        model.generate = scripted_generate
        model.get_output_embeddings().register_forward_hook(self._on_logits)

    def reset(self) -> None:
        """Start the script again (before each rollout)."""
        self.turn, self.step = -1, 0

    def _on_logits(self, module: nn.Module, args: tuple[Any, ...], logits: torch.Tensor) -> torch.Tensor | None:
        if not self._generating:
            return None
        script = self.turns[min(self.turn, len(self.turns) - 1)]
        token = script[min(self.step, len(script) - 1)]
        self.step += 1
        forced = torch.full_like(logits[:, -1], torch.finfo(logits.dtype).min)
        forced[:, token] = 0.0
        return torch.cat([logits[:, :-1], forced[:, None]], dim=1)


def scripts(tokenizer: PreTrainedTokenizerBase) -> tuple[list[list[int]], list[list[int]]]:
    """The 3-turn script (two ``add`` calls, then the answer) and a 1-turn script with as many tokens, EOS included."""

    def ids(text: str) -> list[int]:
        return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]

    call = '<tool_call>{{"name": "add", "arguments": {{"a": {}, "b": {}}}}}</tool_call>'
    multi = [ids(call.format(*_CALLS[0])), ids(call.format(*_CALLS[1])), ids(f"The sum is {add(*_CALLS[1])}.")]
    total = sum(map(len, multi))
    filler = tokenizer("The sum is 72. " * total, add_special_tokens=False)["input_ids"][: total - 1]
    return multi, [[*filler, tokenizer.eos_token_id]]


def measure(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompts: int = 8,
    generations: int = 8,
    repeats: int = 3,
) -> list[Measurement]:
    """Median rollout time of the 3-turn tool task and of the 1-turn baseline, after one warm-up rollout each."""
    multi, single = scripts(tokenizer)
    head = ScriptedHead(model, multi)
    messages = [
        [{"role": "user", "content": f"{a}+{b}+{a + b}?"}] for a, b in [(10 + i, 20 + i) for i in range(prompts)]
    ]
    budget = sum(map(len, multi)) + 256  # room for the tool results: the script, not the budget, ends the turns
    settings = SamplingSettings(num_generations=generations, max_new_tokens=budget)
    results = []
    for name, script, max_turns in (("3 turns, 2 tool calls", multi, 3), ("1 turn, same tokens", single, 1)):
        agent = AgentSettings.build(tokenizer, tools=[add], max_turns=max_turns)
        head.turns, times = script, []
        for _ in range(repeats + 1):
            head.reset()
            _synchronize(model)
            start = time.perf_counter()
            rollout = generate_conversations(model, tokenizer, messages, settings, agent, max_prompt_length=1024)
            _synchronize(model)
            times.append(time.perf_counter() - start)
        sampled = rollout.sampled_mask.sum(1).float()
        context = rollout.completion_mask.sum(1).float() - sampled
        if not bool((sampled == sum(map(len, script))).all()) or bool(rollout.truncated.any()):
            raise RuntimeError(f"{name}: the trajectories did not follow the script; the benchmark is invalid")
        mean = lambda values: values.float().mean().item()  # noqa: E731
        results.append(
            Measurement(
                name, statistics.median(times[1:]), mean(rollout.prompt_mask.sum(1)), mean(rollout.turns.num_turns),
                mean(sampled), mean(context), len(rollout.completions),
            )
        )  # fmt: skip
    return results


def _synchronize(model: nn.Module) -> None:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def format_table(results: Sequence[Measurement]) -> str:
    """A Markdown table of the measurements, with each one's time relative to the last (the baseline)."""
    base = results[-1].seconds
    lines = [
        "| rollout | prompt tokens | turns | sampled tokens | tool tokens | time (s) | sampled tokens/s | vs 1 turn |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in results:
        lines.append(
            f"| {m.name} | {m.prompt_tokens:.0f} | {m.turns:.0f} | {m.sampled_tokens:.0f} | {m.context_tokens:.0f} "
            f"| {m.seconds:.3f} | {m.tokens_per_second:,.0f} | {m.seconds / base:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Measurement]:
    """Build the model, measure both rollouts and print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multi_turn", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=256, help="model width (tiny Qwen2 architecture)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per rollout (B)")
    parser.add_argument("--generations", type=int, default=8, help="trajectories per prompt (G)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rollouts per kind (after one warm-up)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=max(4, args.hidden_size // 64),
        num_kv_heads=max(2, args.hidden_size // 128), max_position_embeddings=2048,
    ).to(args.device)  # fmt: skip
    results = measure(model, tokenizer, prompts=args.prompts, generations=args.generations, repeats=args.repeats)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"multi-turn rollout: {args.hidden_size}-wide, {args.layers}-layer model, B={args.prompts}, "
          f"G={args.generations}, {device}, median of {args.repeats}")  # fmt: skip
    print(format_table(results))
    return results


if __name__ == "__main__":
    main()
