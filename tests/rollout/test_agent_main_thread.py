"""The agents' event loop runs in a worker thread and every batched sampling call on the rollout's own thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lightning_grpo.rollout.agent_client.main_thread import MainThreadCalls


def test_calls_run_on_the_calling_thread_and_the_coroutine_elsewhere():
    calls, seen = MainThreadCalls(), {}

    async def agents() -> list[int]:
        seen["loop"] = threading.get_ident()
        return list(await asyncio.gather(*(calls.call(lambda i: (threading.get_ident(), i), i) for i in range(3))))

    results = calls.run(agents())
    assert {ident for ident, _ in results} == {threading.get_ident()}
    assert [i for _, i in results] == [0, 1, 2]
    assert seen["loop"] != threading.get_ident()


def test_an_error_of_a_call_reaches_the_coroutine_and_one_of_the_coroutine_reaches_the_caller():
    calls = MainThreadCalls()

    def fails() -> None:
        raise ValueError("sampling failed")

    async def agents() -> str:
        with pytest.raises(ValueError, match="sampling failed"):
            await calls.call(fails)
        raise RuntimeError("the rollout's own error")

    with pytest.raises(RuntimeError, match="the rollout's own error"):
        calls.run(agents())


def test_an_interrupt_while_serving_cancels_the_coroutine_and_joins_its_thread():
    calls, cancelled = MainThreadCalls(), threading.Event()

    def interrupted() -> None:
        raise KeyboardInterrupt

    async def agents() -> None:
        try:
            await calls.call(interrupted)
            await asyncio.sleep(60)  # never reached: the call raised on the serving thread
        except asyncio.CancelledError:
            cancelled.set()
            raise

    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        calls.run(agents())
    assert cancelled.is_set()
    assert threading.active_count() == before  # the worker was joined


def test_agent_rollouts_sample_on_the_thread_that_runs_them():
    import torch

    from lightning_grpo.agents import HermesToolCallParser
    from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
    from lightning_grpo.rollout.sampling_settings import Sampled, SamplingSettings
    from lightning_grpo.testing import build_tiny_tokenizer
    from lightning_grpo.testing.agents import short_turn_model

    tokenizer = build_tiny_tokenizer()
    model = short_turn_model(tokenizer, eos_bias=-1e4).eval()
    threads, agent_threads = [], []

    def sample(model, tokenizer, request) -> Sampled:
        threads.append(threading.get_ident())
        rows = request.prompt_ids.repeat_interleave(request.settings.num_generations, dim=0)
        new = torch.full((len(rows), request.settings.max_new_tokens), 5, dtype=torch.long)
        return Sampled(torch.cat([rows, new], dim=1), torch.zeros(new.shape))

    async def agent(client, row):
        agent_threads.append(threading.get_ident())
        await client.chat.completions.create(model="policy", messages=row["prompt"])
        return 1.0

    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}]} for i in range(2)]
    settings = SamplingSettings(num_generations=2, max_new_tokens=3)
    rollout, stats = run_agents(model, tokenizer, agent, rows, settings, HermesToolCallParser(), max_prompt_length=32,
                                limits=AgentLimits(), sample=sample)  # fmt: skip
    assert not stats.failures and len(rollout) == 4
    assert threads == [threading.get_ident()]  # one gathered batch, sampled here
    assert set(agent_threads) and threading.get_ident() not in agent_threads
