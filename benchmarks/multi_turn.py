"""Multi-turn rollout cost: a 3-turn tool task against the same number of sampled tokens in one turn.

Both rollouts sample from the same model through the same conversational path
(:func:`~lightning_grpo.rollout.multi_turn.generate_conversations`), with the tool schema in the prompt. A scripted
output head makes the trajectories exact: the model's logits are computed as usual (so every forward costs what it
costs), then all but the script's next token are masked. The 3-turn task calls ``add`` twice, each result coming
back as a tool message, then answers; the 1-turn baseline samples as many tokens (the same count, EOS included) in
one turn. The difference is the price of the turns: a prefill of the whole context per turn, the tool calls and the
chat-template rendering of their results (``docs/agents.md``, speed; figures in ``docs/benchmarks.md``).

``--turn-cache on`` samples through a Hugging Face backend session that keeps each trajectory's KV cache across turns
(``GRPOConfig.turn_cache``: our own decoding loop, a later turn prefills only the inserted tokens); ``off`` is the
path without it (``generate``, every turn re-prefills its context); ``off on`` measures both, alternating rollouts.
``--turns 5`` makes the task four ``add`` calls and the answer.

    python -m benchmarks.multi_turn                                   # CUDA if available, else CPU
    python -m benchmarks.multi_turn --turn-cache off on --turns 5 --repeats 3
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

from lightning_grpo.backends.hf import HFSession
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from lightning_grpo.testing.agents import add

__all__ = ["Measurement", "ScriptedHead", "main", "measure", "scripts"]

_CALLS = ((31, 24), (55, 17), (72, 9), (81, 6), (87, 5), (92, 3))  # calls to add; the answer is the last result


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
    ratio: tuple[float, float, float] = (1.0, 1.0, 1.0)  # against its 1-turn baseline: median, min, max over repeats

    @property
    def tokens_per_second(self) -> float:
        """Sampled tokens of the whole rollout per second."""
        return self.sampled_tokens * self.trajectories / self.seconds


class ScriptedHead:
    """Hooks that force a model to emit a script: one token list per ``generate`` call (one call per turn).

    Each forward inside ``generate`` emits the next token of that turn's script (a prefill outside ``generate``, the
    shared prompt prefix of turn 0, emits nothing). The logits are computed first, so the cost is the model's own.
    :meth:`script_session` does the same for the calls of a session that samples with our own loop (there every
    forward of a call, the prefill included, yields the logits of a drawn token).
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

    def script_session(self, session: HFSession) -> HFSession:
        """``session`` with each :meth:`~HFSession.sample` call scripted as one turn."""
        sample = session.sample

        def scripted_sample(*args: Any, **kwargs: Any) -> Any:
            self.turn, self.step, self._generating = self.turn + 1, 0, True
            try:
                return sample(*args, **kwargs)
            finally:
                self._generating = False

        session.sample = scripted_sample  # type: ignore[method-assign]
        return session

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


def scripts(tokenizer: PreTrainedTokenizerBase, turns: int = 3) -> tuple[list[list[int]], list[list[int]]]:
    """The ``turns``-turn script (``turns - 1`` ``add`` calls, then the answer) and a 1-turn script with as many
    tokens, EOS included."""
    if not 2 <= turns <= len(_CALLS) + 1:
        raise ValueError(f"turns must be between 2 and {len(_CALLS) + 1}, got {turns}")

    def ids(text: str) -> list[int]:
        return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]

    call = '<tool_call>{{"name": "add", "arguments": {{"a": {}, "b": {}}}}}</tool_call>'
    calls = _CALLS[: turns - 1]
    multi = [*(ids(call.format(*c)) for c in calls), ids(f"The sum is {add(*calls[-1])}.")]
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
    turns: int = 3,
    turn_cache: Sequence[bool] = (False,),
) -> list[Measurement]:
    """Median rollout time of the ``turns``-turn tool task and of the 1-turn baseline for each ``turn_cache`` setting,
    after one warm-up rollout each; the rollouts of one repeat run back to back (so a busy machine slows them alike).
    """
    multi, single = scripts(tokenizer, turns)
    head = ScriptedHead(model, multi)
    messages = [
        [{"role": "user", "content": f"{a}+{b}+{a + b}?"}] for a, b in [(10 + i, 20 + i) for i in range(prompts)]
    ]
    budget = sum(map(len, multi)) + 128 * turns  # room for the tool results: the script, not the budget, ends turns
    settings = SamplingSettings(num_generations=generations, max_new_tokens=budget)
    kinds = [(f"{turns} turns, {turns - 1} tool calls", multi, turns, keep) for keep in turn_cache]
    kinds += [("1 turn, same tokens", single, 1, keep) for keep in turn_cache]
    times: dict[int, list[float]] = {k: [] for k in range(len(kinds))}
    rollouts: dict[int, Any] = {}
    for _ in range(repeats + 1):
        for k, (_name, script, max_turns, keep) in enumerate(kinds):
            agent = AgentSettings.build(tokenizer, tools=[add], max_turns=max_turns)
            head.turns = script
            head.reset()
            session = head.script_session(HFSession(model, "as_trained", turn_cache=True)) if keep else None
            _synchronize(model)
            start = time.perf_counter()
            rollouts[k] = generate_conversations(
                model, tokenizer, messages, settings, agent, max_prompt_length=1024, sample=session
            )
            _synchronize(model)
            times[k].append(time.perf_counter() - start)
    return [_measurement(kinds, k, rollouts[k], times, len(turn_cache)) for k in range(len(kinds))]


def _measurement(kinds: list[tuple[str, list[list[int]], int, bool]], k: int, rollout: Any,
                 times: dict[int, list[float]], settings: int) -> Measurement:  # fmt: skip
    """One kind's :class:`Measurement`, its ratio to the 1-turn rollout of the same setting, repeat by repeat."""
    name, script, _, keep = kinds[k]
    sampled = rollout.sampled_mask.sum(1).float()
    context = rollout.completion_mask.sum(1).float() - sampled
    if not bool((sampled == sum(map(len, script))).all()) or bool(rollout.truncated.any()):
        raise RuntimeError(f"{name}: the trajectories did not follow the script; the benchmark is invalid")
    base = times[k % settings + len(kinds) - settings]
    ratios = [t / b for t, b in zip(times[k][1:], base[1:], strict=True)]
    mean = lambda values: values.float().mean().item()  # noqa: E731
    return Measurement(
        f"{name} (turn cache {'on' if keep else 'off'})", statistics.median(times[k][1:]),
        mean(rollout.prompt_mask.sum(1)), mean(rollout.turns.num_turns), mean(sampled), mean(context),
        len(rollout.completions), (statistics.median(ratios), min(ratios), max(ratios)),
    )  # fmt: skip


def _synchronize(model: nn.Module) -> None:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def format_table(results: Sequence[Measurement]) -> str:
    """A Markdown table of the measurements, each with its time relative to the 1-turn rollout of the same turn-cache
    setting (median over the repeats, each repeat's two rollouts paired, and their range)."""
    lines = [
        "| rollout | prompt tokens | turns | sampled tokens | tool tokens | time (s) | sampled tokens/s | vs 1 turn |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in results:
        median, low, high = m.ratio
        lines.append(
            f"| {m.name} | {m.prompt_tokens:.0f} | {m.turns:.0f} | {m.sampled_tokens:.0f} | {m.context_tokens:.0f} "
            f"| {m.seconds:.3f} | {m.tokens_per_second:,.0f} | {median:.2f}x ({low:.2f}–{high:.2f}) |"
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
    parser.add_argument("--turns", type=int, default=3, help="turns of the tool task (turns - 1 add calls)")
    parser.add_argument("--turn-cache", nargs="+", choices=("off", "on"), default=["off"],
                        help="keep the KV caches across turns; 'off on' measures both, alternating")  # fmt: skip
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=max(4, args.hidden_size // 64),
        num_kv_heads=max(2, args.hidden_size // 128), max_position_embeddings=2048,
    ).to(args.device)  # fmt: skip
    keep = [choice == "on" for choice in args.turn_cache]
    results = measure(model, tokenizer, prompts=args.prompts, generations=args.generations, repeats=args.repeats,
                      turns=args.turns, turn_cache=keep)  # fmt: skip
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"multi-turn rollout: {args.hidden_size}-wide, {args.layers}-layer model, B={args.prompts}, "
          f"G={args.generations}, {device}, median of {args.repeats}")  # fmt: skip
    print(format_table(results))
    return results


if __name__ == "__main__":
    main()
