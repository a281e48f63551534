"""Agent-code rollouts: 64 concurrent single-call agents on the in-process client against the ordinary rollout.

Both sample the same prompts (8 rows × G=8) from the same tiny model with the same settings; the model's head has a
large negative end-of-turn bias, so every sample is exactly ``--tokens`` long and both paths sample the same number
of tokens. The agent path goes through ``openai.AsyncOpenAI.chat.completions.create``, the call gatherer (all 64
calls in one batched sampling call when every agent waits, the G calls of a row one prompt prefilled once), the
recorder and the rollout assembly; the ordinary path is :func:`~lightning_grpo.rollout.multi_turn.
generate_conversations` (which also shares each prompt's prefill across its G samples). Runs alternate (agent,
ordinary, ...) after one untimed run of each, so that contention hits all paths alike; the table gives each path's
median and range over ``--repeats`` runs, then the ratios of medians.

``--http`` adds the same agents over the loopback HTTP server (``GRPOConfig.agents.agent_transport="http"``: the
``openai`` SDK's real HTTP client, one key per trajectory) and the **HTTP floor**: the same agents answered by an echo
sampler (``--tokens`` fixed tokens per call, no model run) over HTTP and in process; their difference is what HTTP adds
to a rollout whatever the sampling, and the HTTP run is compared with the in-process run plus that floor.
``--one-at-a-time`` adds a path whose calls are serialised (each sampled alone): what gathering saves (slow).

    python -m benchmarks.agent_client --repeats 5                 # CUDA if available, else CPU
    python -m benchmarks.agent_client --repeats 5 --http          # also over HTTP, with the floor
    python -m benchmarks.agent_client --repeats 1 --tokens 2 --rows 2 --generations 2 --http   # a dry run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import short_turn_model

__all__ = ["echo_sampler", "main"]

AGENT, ORDINARY, HTTP = "agent client", "ordinary rollout", "agent client over HTTP"
ECHO, ECHO_HTTP, ALONE = "echo, in process", "echo over HTTP", "agent client, calls one at a time"


async def one_call(client, row):
    """A single-call agent."""
    await client.chat.completions.create(model="policy", messages=row["prompt"])
    return 1.0


_ONE_AT_A_TIME: list[asyncio.Lock] = []


async def one_call_alone(client, row):
    """A single-call agent whose call is sampled alone (a lock shared by all runs): what gathering saves."""
    async with _ONE_AT_A_TIME[-1]:
        await client.chat.completions.create(model="policy", messages=row["prompt"])
    return 1.0


def echo_sampler(token: int) -> Callable[..., Sampled]:
    """A sampler that runs no model: every row gets ``max_new_tokens`` copies of ``token`` (log-prob 0)."""

    def sample(model: Any, tokenizer: Any, request: SampleRequest) -> Sampled:
        settings = request.settings
        rows = request.prompt_ids.repeat_interleave(settings.num_generations, dim=0)
        new = torch.full((len(rows), settings.max_new_tokens), token, dtype=torch.long, device=rows.device)
        return Sampled(torch.cat([rows, new], dim=1), torch.zeros(new.shape, device=rows.device))

    return sample


def _paths(args: argparse.Namespace, model: Any, tokenizer: Any) -> dict[str, Callable[[], Any]]:
    """Each timed path: a function returning the rollout it sampled."""
    rows = [{"prompt": [{"role": "user", "content": f"question {i}: {i}+{i}?"}]} for i in range(args.rows)]
    settings = SamplingSettings(num_generations=args.generations, max_new_tokens=args.tokens)
    echo = echo_sampler(tokenizer("a", add_special_tokens=False)["input_ids"][0])

    def agents(agent: Any, transport: str = "in_process", sample: Any = None) -> Callable[[], Any]:
        def run() -> Any:
            rollout, stats = run_agents(
                model,
                tokenizer,
                agent,
                rows,
                settings,
                HermesToolCallParser(),
                max_prompt_length=64,
                limits=AgentLimits(transport=transport),
                sample=sample,
            )
            if stats.failures:
                raise RuntimeError(f"{len(stats.failures)} agents failed ({transport}): {stats.failures[0]}")
            return rollout

        return run

    def ordinary() -> Any:
        prompts = [row["prompt"] for row in rows]
        return generate_conversations(model, tokenizer, prompts, settings, AgentSettings(), max_prompt_length=64)

    def alone() -> Any:
        _ONE_AT_A_TIME.append(asyncio.Lock())
        return agents(one_call_alone)()

    paths = {AGENT: agents(one_call), ORDINARY: ordinary}
    if args.http:
        paths |= {
            HTTP: agents(one_call, "http"),
            ECHO: agents(one_call, sample=echo),
            ECHO_HTTP: agents(one_call, "http", sample=echo),
        }
    if args.one_at_a_time:
        paths[ALONE] = alone
    return paths


def _report(times: dict[str, list[float]], tokens: dict[str, int], calls: int) -> list[str]:
    """The table of every path (median, range), then the ratios the targets read."""
    lines = ["| path | median s | min–max s | calls/s | sampled tokens/s | tokens |", "|---|---|---|---|---|---|"]
    med = {name: statistics.median(seconds) for name, seconds in times.items()}
    for name, seconds in times.items():
        lines.append(
            f"| {name} | {med[name]:.3f} | {min(seconds):.3f}–{max(seconds):.3f} | {calls / med[name]:.1f} "
            f"| {tokens[name] / med[name]:.0f} | {tokens[name]} |"
        )
    lines.append(f"agent client / ordinary rollout (medians): {med[AGENT] / med[ORDINARY]:.2f}")
    if HTTP in med:
        floor = med[ECHO_HTTP] - med[ECHO]
        lines += [
            f"HTTP floor (echo over HTTP - echo in process, medians): {floor:.3f} s, {1e3 * floor / calls:.2f} ms "
            "per call",
            f"agent client in process + floor: {med[AGENT] + floor:.3f} s; over HTTP: {med[HTTP]:.3f} s; "
            f"ratio {med[HTTP] / (med[AGENT] + floor):.2f}",
        ]
    return lines


def main(argv: list[str] | None = None) -> None:
    """Time every path, alternating, and print the table and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--http", action="store_true", help="also time the agents over HTTP, and the HTTP floor")
    parser.add_argument("--one-at-a-time", action="store_true", help="also time the calls sampled one at a time")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tiny_tokenizer()
    model = short_turn_model(tokenizer, eos_bias=-1e4).to(device).eval()
    paths = _paths(args, model, tokenizer)
    times: dict[str, list[float]] = {name: [] for name in paths}
    tokens: dict[str, int] = {}
    for run in paths.values():  # untimed: imports, the SDK's client state, the server's first start
        run()
    for _ in range(args.repeats):
        for name, run in paths.items():
            start = time.perf_counter()
            rollout = run()
            times[name].append(time.perf_counter() - start)
            tokens[name] = int(rollout.sampled_mask.sum())
    calls = args.rows * args.generations
    print(f"device {device}, {calls} single-call agents, {args.tokens} tokens each, {args.repeats} repeats")
    print("\n".join(_report(times, tokens, calls)))


if __name__ == "__main__":
    main()
