"""Multi-turn rollout cost: a 3-turn tool task against the same number of sampled tokens in one turn.

Both rollouts sample from the same model through the same conversational path
(:func:`~lightning_grpo.rollout.multi_turn.generate_conversations`), with the tool schema in the prompt. A scripted
output head makes the trajectories exact: the model's logits are computed as usual (so every forward costs what it
costs), then all but the script's next token are masked. The 3-turn task calls ``add`` twice, each result coming
back as a tool message, then answers; the 1-turn baseline samples as many tokens (the same count, EOS included) in
one turn. The difference is the price of the turns: a prefill of the whole context per turn, the tool calls and the
chat-template rendering of their results (``docs/agents.md``, speed; figures in ``docs/benchmarks.md``).

Every rollout samples through the Hugging Face backend's session, as a run does. ``--turn-cache default`` (the
default) leaves ``GRPOConfig.agents.turn_cache`` at its default: the multi-turn rollout keeps each trajectory's KV cache
across turns (our own decoding loop, the default ``multinomial`` sampler; a later turn prefills only the inserted
tokens) and the 1-turn rollout, a single-turn run, samples with ``generate``. ``on`` keeps the turn cache for both
(``turn_cache: true``), ``off`` for neither (``generate``, every turn re-prefills its context); several settings are
measured alternating. ``--turns 3 5`` (the default) measures a 3-turn task (two ``add`` calls and the answer) and a
5-turn one (four calls), each against its own 1-turn baseline, and prints the ratios against their targets (3 turns
at most 1.3x one turn, 5 turns at most 1.5x; ``docs/agents.md``, cost). The vLLM backend's ratio, on a task whose
turn lengths come from the model, is :mod:`benchmarks.multi_turn_vllm`.

    python -m benchmarks.multi_turn                                   # CUDA if available, else CPU
    python -m benchmarks.multi_turn --turn-cache off default --turns 5 --repeats 3
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

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.backends.hf import HFBackend, HFSession
from lightning_grpo.backends.protocol import BackendSpec
from lightning_grpo.config import AgentConfig
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from lightning_grpo.testing.agents import add

__all__ = ["TARGETS", "Measurement", "ScriptedHead", "main", "measure", "scripts"]

_CALLS = ((31, 24), (55, 17), (72, 9), (81, 6), (87, 5), (92, 3))  # calls to add; the answer is the last result
#: The most a rollout of that many turns may cost against one turn of the same sampled tokens (issue 52).
TARGETS = {3: 1.3, 5: 1.5}
#: ``--turn-cache`` choices: ``GRPOConfig.agents.turn_cache`` values.
SETTINGS: dict[str, bool | None] = {"default": None, "on": True, "off": False}


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


@dataclass(frozen=True)
class _Kind:
    """One rollout measured: its script, turns, ``GRPOConfig.agents.turn_cache`` value and its 1-turn baseline's
    index."""

    name: str
    script: list[list[int]]
    turns: int
    turn_cache: bool | None
    base: int
    budget: int


def measure(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompts: int = 8,
    generations: int = 8,
    repeats: int = 3,
    turns: Sequence[int] = (3,),
    turn_cache: Sequence[bool | None] = (None,),
) -> list[Measurement]:
    """Median rollout time of each ``turns``-turn tool task and of its 1-turn baseline for each ``turn_cache`` value
    (``GRPOConfig.agents.turn_cache``), after one warm-up rollout each; the rollouts of one repeat run back to back (so
    a busy machine slows them alike). Per ``turns``: its multi-turn rollouts, then its 1-turn ones, in ``turn_cache``
    order."""
    head = ScriptedHead(model, [[tokenizer.eos_token_id]])
    messages = [
        [{"role": "user", "content": f"{a}+{b}+{a + b}?"}] for a, b in [(10 + i, 20 + i) for i in range(prompts)]
    ]
    kinds = _kinds(tokenizer, turns, turn_cache)
    times: dict[int, list[float]] = {k: [] for k in range(len(kinds))}
    rollouts: dict[int, Any] = {}
    kept: dict[int, bool] = {}
    for _ in range(repeats + 1):
        for k, kind in enumerate(kinds):
            settings = SamplingSettings(num_generations=generations, max_new_tokens=kind.budget)
            agent = AgentSettings.build(tokenizer, tools=[add], max_turns=kind.turns)
            head.turns = kind.script
            head.reset()
            session = _session(model, settings, kind, head)
            kept[k] = session.turn_cache is not None
            _synchronize(model)
            start = time.perf_counter()
            try:
                rollouts[k] = generate_conversations(
                    model, tokenizer, messages, settings, agent, max_prompt_length=1024, sample=session
                )
            finally:
                session.close()
            _synchronize(model)
            times[k].append(time.perf_counter() - start)
    return [_measurement(kind, rollouts[k], times[k], times[kind.base], kept[k]) for k, kind in enumerate(kinds)]


def _kinds(tokenizer: PreTrainedTokenizerBase, turns: Sequence[int], settings: Sequence[bool | None]) -> list[_Kind]:
    kinds: list[_Kind] = []
    for count in turns:
        multi, single = scripts(tokenizer, count)
        first = len(kinds) + len(settings)  # the index of this task's first 1-turn rollout
        budget = sum(map(len, multi)) + 128 * count  # room for the tool results: the script, not the budget, ends turns
        for name, script, max_turns in (
            (f"{count} turns, {count - 1} tool calls", multi, count),
            (f"1 turn, the tokens of {count}", single, 1),
        ):
            kinds += [_Kind(name, script, max_turns, keep, first + i, budget) for i, keep in enumerate(settings)]
    return kinds


def _session(model: nn.Module, settings: SamplingSettings, kind: _Kind, head: ScriptedHead) -> HFSession:
    """The session a run with ``kind``'s turns and turn-cache setting opens (tools: a multi-turn run), scripted."""
    grpo = GRPOConfig(agents=AgentConfig(max_turns=kind.turns, turn_cache=kind.turn_cache))
    backend = HFBackend(None, BackendSpec(grpo, PolicyConfig(), multi_turn=kind.turns > 1))
    session = backend.session(model, settings)
    return head.script_session(session) if session.turn_cache is not None else session  # else generate is scripted


def _measurement(kind: _Kind, rollout: Any, times: list[float], base: list[float], kept: bool) -> Measurement:
    """One kind's :class:`Measurement`, its ratio to the 1-turn rollout of the same setting, repeat by repeat."""
    sampled = rollout.sampled_mask.sum(1).float()
    context = rollout.completion_mask.sum(1).float() - sampled
    if not bool((sampled == sum(map(len, kind.script))).all()) or bool(rollout.truncated.any()):
        raise RuntimeError(f"{kind.name}: the trajectories did not follow the script; the benchmark is invalid")
    ratios = [t / b for t, b in zip(times[1:], base[1:], strict=True)]
    mean = lambda values: values.float().mean().item()  # noqa: E731
    setting = {None: "default: ", True: "true: ", False: "false: "}[kind.turn_cache]
    return Measurement(
        f"{kind.name} (turn_cache {setting}{'on' if kept else 'off'})",
        statistics.median(times[1:]),
        mean(rollout.prompt_mask.sum(1)),
        mean(rollout.turns.num_turns),
        mean(sampled),
        mean(context),
        len(rollout.completions),
        (statistics.median(ratios), min(ratios), max(ratios)),
    )


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


def format_ratios(results: Sequence[Measurement]) -> str:
    """One line per multi-turn rollout: its time against one turn of the same tokens, and the target it must meet."""
    lines = []
    for m in results:
        if m.turns > 1:
            median, low, high = m.ratio
            target = TARGETS.get(round(m.turns))
            verdict = "" if target is None else f"; target <= {target}x: {'holds' if median <= target else 'MISSED'}"
            lines.append(f"{m.name}: {median:.2f}x one turn ({low:.2f}-{high:.2f}){verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Measurement]:
    """Build the model, measure the rollouts and print the table and the ratios."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multi_turn", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=256, help="model width (tiny Qwen2 architecture)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per rollout (B)")
    parser.add_argument("--generations", type=int, default=8, help="trajectories per prompt (G)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rollouts per kind (after one warm-up)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--turns", type=int, nargs="+", default=[3, 5], help="turns of each task (turns - 1 calls)")
    parser.add_argument(
        "--turn-cache",
        nargs="+",
        choices=tuple(SETTINGS),
        default=["default"],
        help="GRPOConfig.agents.turn_cache: default (null), on (true), off (false); several alternate",
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=max(4, args.hidden_size // 64),
        num_kv_heads=max(2, args.hidden_size // 128),
        max_position_embeddings=4096,
    ).to(args.device)
    settings = [SETTINGS[choice] for choice in args.turn_cache]
    results = measure(
        model,
        tokenizer,
        prompts=args.prompts,
        generations=args.generations,
        repeats=args.repeats,
        turns=args.turns,
        turn_cache=settings,
    )
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(
        f"multi-turn rollout: {args.hidden_size}-wide, {args.layers}-layer model, B={args.prompts}, "
        f"G={args.generations}, {device}, median of {args.repeats}"
    )
    print(format_table(results))
    print(format_ratios(results))
    return results


if __name__ == "__main__":
    main()
