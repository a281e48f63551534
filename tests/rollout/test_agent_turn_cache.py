"""Agent code's calls under the turn cache: a run that is busy (a tool) when a batch is sampled keeps its cache, and
its next call prefills only the tokens new since its last one; a run that returned has its caches dropped
(docs/agents.md, cost)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.backends.hf import HFSession
from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing.agents import short_turn_model

IDS = {"return_token_ids": True}
ROWS = [{"prompt": [{"role": "user", "content": f"task {name}"}], "name": name} for name in ("fast", "slow", "once")]


@pytest.fixture(scope="module")
def tokenizer():
    from lightning_grpo.testing import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return short_turn_model(tokenizer).double().eval()  # float64: no rounding flips a draw


def _out_of_step_agent(replies: dict[str, list]):
    """``fast`` calls twice, then lets ``slow`` go on and calls a third time; ``slow`` calls once, waits for ``fast``
    (a tool that takes a while: it is absent from ``fast``'s second batch), then calls again; ``once`` calls once and
    returns. Each call continues its run's history (one branch per run)."""
    go_on = asyncio.Event()  # bound to the rollout's event loop at its first wait

    async def agent(client, row):
        calls = {"fast": 3, "slow": 2, "once": 1}[row["name"]]
        messages = list(row["prompt"])
        for turn in range(calls):
            if row["name"] == "slow" and turn == 1:
                await go_on.wait()
            if row["name"] == "fast" and turn == 2:
                go_on.set()
            reply = await client.chat.completions.create(model="policy", messages=messages, extra_body=IDS)
            replies.setdefault(row["name"], []).append(reply)
            messages += [reply.choices[0].message, {"role": "user", "content": f"tool result {turn}"}]
        return 1.0

    return agent


def _run(model, tokenizer, turn_cache: bool, transport: str = "in_process"):
    """The three runs through a Hugging Face session; each sampling call's (rows, tokens prefilled, caches kept)."""
    session, replies, calls = HFSession(model, "as_trained", turn_cache=turn_cache), {}, []
    if turn_cache:
        cache, sample = session.turn_cache, session.turn_cache.sample

        def counting(model, tokenizer, request):
            before = cache.prefilled
            out = sample(model, tokenizer, request)
            calls.append((list(request.rows), cache.prefilled - before, len(cache)))
            return out

        cache.sample = counting
    torch.manual_seed(0)
    settings = SamplingSettings(num_generations=1, max_new_tokens=200)
    rollout, stats = run_agents(model, tokenizer, _out_of_step_agent(replies), ROWS, settings, HermesToolCallParser(),
                                max_prompt_length=64, limits=AgentLimits(window=0.05, transport=transport),
                                sample=session)  # fmt: skip
    return rollout, stats, session, replies, calls


def test_a_run_out_of_step_keeps_its_cache_and_prefills_only_its_new_tokens(model, tokenizer):
    rollout, stats, session, replies, calls = _run(model, tokenizer, turn_cache=True)
    assert stats.batches == [3, 1, 2]  # [fast, slow, once], [fast] (slow is busy), [fast, slow]
    assert len(rollout) == 3 and rollout.truncated.tolist() == [False] * 3  # one open branch per run
    cache = session.turn_cache

    first = sum(len(replies[name][0].prompt_token_ids) for name in ("fast", "slow", "once"))
    new_tokens = lambda name, call: _new_tokens(replies[name], call)  # noqa: E731
    assert [prefilled for _, prefilled, _ in calls] == [
        first, new_tokens("fast", 1), new_tokens("fast", 2) + new_tokens("slow", 1)
    ]  # fmt: skip
    assert new_tokens("slow", 1) < len(replies["slow"][1].prompt_token_ids)  # not its whole context again
    assert cache.reused > 0
    # memory: "once" returned after the first batch: its cache is gone at the second; the last runs' at the end
    assert [kept for _, _, kept in calls] == [3, 2, 2]
    assert len(cache) == 0


@pytest.mark.parametrize("transport", ["in_process", "http"])
def test_over_either_transport_each_later_call_prefills_only_its_new_tokens(model, tokenizer, transport):
    """Whatever the batches (HTTP's timing may split or join them), the rollout prefills each run's first context and
    then only what each later call adds."""
    _, _, session, replies, _ = _run(model, tokenizer, turn_cache=True, transport=transport)
    calls = replies.values()
    expected = sum(len(r[0].prompt_token_ids) + sum(_new_tokens(r, i) for i in range(1, len(r))) for r in calls)
    assert sorted(len(r) for r in calls) == [1, 2, 3]
    assert session.turn_cache.prefilled == expected and len(session.turn_cache) == 0


def _new_tokens(replies: list, call: int) -> int:
    """The tokens a run's ``call`` adds to what its cache holds: the last context and reply but its last token."""
    last, now = replies[call - 1], replies[call]
    return len(now.prompt_token_ids) - (len(last.prompt_token_ids) + len(last.choices[0].token_ids) - 1)


def test_keeping_the_cache_of_a_run_out_of_step_samples_the_tokens_of_a_full_re_prefill(model, tokenizer):
    kept, kept_stats, _, _, _ = _run(model, tokenizer, turn_cache=True)
    full, full_stats, session, _, _ = _run(model, tokenizer, turn_cache=False)
    assert session.turn_cache is None and kept_stats.batches == full_stats.batches
    assert torch.equal(kept.completion_ids, full.completion_ids)
    assert torch.equal(kept.sampled_mask, full.sampled_mask)
    torch.testing.assert_close(kept.logprobs, full.logprobs, rtol=0, atol=1e-6)


def test_padding_rows_leave_no_cache(model, tokenizer):
    """One run of row 0 raises before calling: 15 calls in groups of 8 and 7, one g=8 call with a padding row."""
    numbers = itertools.count()
    session = HFSession(model, "as_trained", turn_cache=True)
    cache, sample, kept = session.turn_cache, session.turn_cache.sample, []

    def counting(*args, **kwargs):
        kept.append(len(cache))  # before the call: the previous calls' padding rows are gone
        return sample(*args, **kwargs)

    cache.sample = counting

    async def agent(client, row):
        if next(numbers) == 0:
            raise ValueError("no call")
        messages = list(row["prompt"])
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message, {"role": "user", "content": "more"}]
        await client.chat.completions.create(model="policy", messages=messages)
        return 1.0

    torch.manual_seed(0)
    settings = SamplingSettings(num_generations=8, max_new_tokens=60)
    _, stats = run_agents(model, tokenizer, agent, ROWS[:2], settings, HermesToolCallParser(), max_prompt_length=64,
                          limits=AgentLimits(), sample=session)  # fmt: skip
    assert stats.batches[0] == 15 and len(stats.failures) == 1 and len(kept) >= 2
    assert kept[1] == 15  # 16 rows sampled first (one padding), only the 15 branches' caches kept
    assert len(cache) == 0
