"""Agent-code rollouts: 64 concurrent single-call agents on the in-process client against the ordinary rollout.

Both sample the same prompts (8 rows × G=8) from the same tiny model with the same settings; the model's head has a
large negative end-of-turn bias, so every sample is exactly ``--tokens`` long and both paths sample the same number
of tokens. The agent path goes through ``openai.AsyncOpenAI.chat.completions.create``, the call gatherer (all 64
calls in one batched sampling call when every agent waits), the recorder and the rollout assembly; the ordinary path
is :func:`~lightning_grpo.rollout.multi_turn.generate_conversations` (which also shares each prompt's prefill across
its G samples). A third path serialises the agents' calls (each sampled alone), which shows what gathering saves.
Runs alternate (agent, ordinary, one at a time, agent, ...) so that contention hits both alike; medians are printed.
``--http`` adds a fourth path: the same agents over the loopback HTTP server (``GRPOConfig.agent_transport="http"``:
the ``openai`` SDK's real HTTP client, one key per trajectory), the load figure of docs/benchmarks.md.

    python -m benchmarks.agent_client                     # CUDA if available, else CPU
    python -m benchmarks.agent_client --repeats 1 --tokens 8
    python -m benchmarks.agent_client --http --rows 32 --generations 8 --tokens 8   # 256 agents, also over HTTP
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import short_turn_model

__all__ = ["main"]


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


def main(argv: list[str] | None = None) -> None:
    """Time both paths and print calls/s and sampled tokens/s."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--http", action="store_true", help="also time the agents over the loopback HTTP server")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tiny_tokenizer()
    model = short_turn_model(tokenizer, eos_bias=-1e4).to(device).eval()
    rows = [{"prompt": [{"role": "user", "content": f"question {i}: {i}+{i}?"}]} for i in range(args.rows)]
    settings = SamplingSettings(num_generations=args.generations, max_new_tokens=args.tokens)
    calls = args.rows * args.generations
    times: dict[str, list[float]] = {
        "agent client": [],
        "ordinary rollout": [],
        "agent client, calls one at a time": [],
        **({"agent client over HTTP": []} if args.http else {}),
    }
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):
        start = time.perf_counter()
        rollout, stats = run_agents(model, tokenizer, one_call, rows, settings, HermesToolCallParser(),
                                    max_prompt_length=64, limits=AgentLimits())  # fmt: skip
        times["agent client"].append(time.perf_counter() - start)
        tokens["agent client"] = int(rollout.sampled_mask.sum())
        batches = stats.batches
        start = time.perf_counter()
        prompts = [row["prompt"] for row in rows]
        ordinary = generate_conversations(model, tokenizer, prompts, settings, AgentSettings(), max_prompt_length=64)
        times["ordinary rollout"].append(time.perf_counter() - start)
        tokens["ordinary rollout"] = int(ordinary.sampled_mask.sum())
        _ONE_AT_A_TIME.append(asyncio.Lock())
        start = time.perf_counter()
        alone, _ = run_agents(model, tokenizer, one_call_alone, rows, settings, HermesToolCallParser(),
                              max_prompt_length=64, limits=AgentLimits())  # fmt: skip
        times["agent client, calls one at a time"].append(time.perf_counter() - start)
        tokens["agent client, calls one at a time"] = int(alone.sampled_mask.sum())
        if args.http:
            start = time.perf_counter()
            served, http_stats = run_agents(model, tokenizer, one_call, rows, settings, HermesToolCallParser(),
                                            max_prompt_length=64, limits=AgentLimits(transport="http"))  # fmt: skip
            times["agent client over HTTP"].append(time.perf_counter() - start)
            tokens["agent client over HTTP"] = int(served.sampled_mask.sum())
            if http_stats.failures:
                raise RuntimeError(f"{len(http_stats.failures)} agents failed over HTTP: {http_stats.failures[0]}")
    print(f"device {device}, {calls} single-call agents, {args.tokens} tokens each, sampling batches {batches}")
    print("| path | median s | calls/s | sampled tokens/s | tokens |")
    print("|---|---|---|---|---|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median:.3f} | {calls / median:.1f} | {tokens[name] / median:.0f} | {tokens[name]} |")


if __name__ == "__main__":
    main()
