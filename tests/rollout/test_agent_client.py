"""Agents written against the real ``openai`` SDK, answered in process by the policy: token-exact rows, masks,
behaviour log-probs equal to the training pass, branches, faults, refusals (docs/agents.md, "Your own agent code")."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
import torch

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout.agent_client import AgentLimits, check_agent, run_agents
from lightning_grpo.rollout.chat import continuation_ids
from lightning_grpo.rollout.sampling_settings import Sampled, SamplingSettings
from lightning_grpo.testing.agents import short_turn_model

ROWS = [
    {"prompt": [{"role": "user", "content": "hi"}], "n": 1},
    {"prompt": [{"role": "user", "content": "yo"}], "n": 2},
]
IDS = {"return_token_ids": True}


def _run(tokenizer, agent, *, model=None, rows=ROWS, g=2, limits=None, sample=None, max_new_tokens=60):
    torch.manual_seed(0)
    model = model if model is not None else short_turn_model(tokenizer)
    settings = SamplingSettings(num_generations=g, max_new_tokens=max_new_tokens)
    return run_agents(model, tokenizer, agent, rows, settings, HermesToolCallParser(), max_prompt_length=200,
                      limits=limits or AgentLimits(), sample=sample)  # fmt: skip


def _row_tokens(rollout, i):
    n = int(rollout.completion_mask[i].sum())
    return rollout.completion_ids[i, :n].tolist(), rollout.sampled_mask[i, :n].tolist(), rollout.logprobs[i, :n]


def _assert_logprobs_match_training(model, rollout):
    train = completion_logprobs(model, rollout, temperature=1.0, fused_head=False).logprobs
    mask = rollout.sampled_mask.bool()
    torch.testing.assert_close(rollout.logprobs[mask], train[mask].float(), rtol=0, atol=1e-4)


def test_a_single_call_agent_gives_one_exact_row(tokenizer):
    seen = []

    async def agent(client, row):
        assert isinstance(client, openai.AsyncOpenAI)
        reply = await client.chat.completions.create(model="policy", messages=row["prompt"], extra_body=IDS)
        seen.append(reply)
        return float(row["n"])

    model = short_turn_model(tokenizer)
    rollout, stats = _run(tokenizer, agent, model=model)
    assert len(rollout) == 4 and stats.batches == [4] and not stats.failures  # one batch for all four calls
    assert all(reply.choices[0].finish_reason in ("stop", "length") for reply in seen)
    for i in range(4):
        tokens, sampled, _ = _row_tokens(rollout, i)
        assert any(r.choices[0].token_ids == tokens for r in seen)
        assert sampled == [1] * len(tokens)
        prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
        assert any(r.prompt_token_ids == prompt and r.choices[0].token_ids == tokens for r in seen)
    assert rollout.columns["agent_reward"] == [1.0, 1.0, 2.0, 2.0] and rollout.group_ids.tolist() == [0, 0, 1, 1]
    _assert_logprobs_match_training(model, rollout)


def test_an_extended_history_gives_one_sequence_with_exact_masks(tokenizer):
    replies = {}

    async def agent(client, row):
        messages = list(row["prompt"])
        first = await client.chat.completions.create(model="policy", messages=messages, extra_body=IDS)
        messages += [first.choices[0].message, {"role": "user", "content": "and?"}]
        second = await client.chat.completions.create(model="policy", messages=messages, extra_body=IDS)
        replies[tuple(second.prompt_token_ids + second.choices[0].token_ids)] = (first, second, messages)
        return 1.0

    model = short_turn_model(tokenizer)
    rollout, stats = _run(tokenizer, agent, model=model, max_new_tokens=200)
    assert len(rollout) == 4 and stats.batches == [4, 4]  # one sequence per trajectory
    for i in range(4):
        tokens, sampled, _ = _row_tokens(rollout, i)
        prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
        first, second, messages = replies[tuple(prompt + tokens)]
        a, b = first.choices[0].token_ids, second.choices[0].token_ids
        inserted = continuation_ids(tokenizer, [*messages[:1], {"role": "assistant",
                                    "content": first.choices[0].message.content}], messages[2:])  # fmt: skip
        assert tokens == [*a, *inserted, *b]  # the first turn's sampled ids, never re-tokenised
        assert sampled == [1] * len(a) + [0] * len(inserted) + [1] * len(b)
        assert second.prompt_token_ids == prompt + a + inserted
    _assert_logprobs_match_training(model, rollout)


def test_an_edited_history_gives_two_sequences(tokenizer):
    async def agent(client, row):
        first = await client.chat.completions.create(model="policy", messages=row["prompt"])
        edited = [*row["prompt"], {"role": "assistant", "content": first.choices[0].message.content + "!"},
                  {"role": "user", "content": "again"}]  # fmt: skip
        await client.chat.completions.create(model="policy", messages=edited)
        return 0.5

    model = short_turn_model(tokenizer)
    rollout, _ = _run(tokenizer, agent, model=model)
    assert len(rollout) == 8  # two sequences per trajectory
    assert rollout.columns["agent_trajectory"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rollout.columns["agent_last"] == [False, True] * 4
    context = rollout.completion_mask.bool() & ~rollout.sampled_mask.bool()
    assert not context.any()  # each branch holds one sampled turn; the edited one is part of branch 2's prompt
    _assert_logprobs_match_training(model, rollout)


def _scripted(tokenizer, reply, first_delay=0.0):
    """A sampler writing ``reply(context_text)`` and an end-of-turn token for every row (log-prob -0.25 each); its
    first call takes ``first_delay`` seconds."""
    delays = [first_delay]

    def sample(model, tok, request):
        time.sleep(delays.pop() if delays else 0.0)
        prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        g = settings.num_generations  # a prompt shared by g calls is given once, for g rows
        prompt_ids, prompt_mask = prompt_ids.repeat_interleave(g, 0), prompt_mask.repeat_interleave(g, 0)
        rows = [tokenizer(reply(tokenizer.decode(ids[m.bool()])), add_special_tokens=False)["input_ids"]
                + [tokenizer.eos_token_id] for ids, m in zip(prompt_ids, prompt_mask, strict=True)]  # fmt: skip
        width = max(map(len, rows))
        new = torch.full((len(rows), width), tokenizer.pad_token_id)
        for i, row in enumerate(rows):
            new[i, : len(row)] = torch.tensor(row)
        return Sampled(torch.cat([prompt_ids, new], 1), torch.full(new.shape, -0.25))

    return sample


ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}  # fmt: skip


def test_tool_calls_come_back_parsed_and_the_tool_result_is_context(tokenizer):
    def reply(context):
        return (
            "5 it is" if "T:\n" in context else '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        )

    async def agent(client, row):
        messages = list(row["prompt"])
        first = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "add"
        arguments = json.loads(message.tool_calls[0].function.arguments)
        messages += [message, {"role": "tool", "tool_call_id": message.tool_calls[0].id,
                               "content": str(arguments["a"] + arguments["b"])}]  # fmt: skip
        second = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD], logprobs=True)
        assert second.choices[0].message.content == "5 it is" and second.choices[0].finish_reason == "stop"
        assert [c.logprob for c in second.choices[0].logprobs.content] == [-0.25] * 8
        return 1.0

    rollout, stats = _run(tokenizer, agent, rows=ROWS[:1], sample=_scripted(tokenizer, reply), max_new_tokens=200)
    assert not stats.failures and len(rollout) == 2
    tokens, sampled, logprobs = _row_tokens(rollout, 0)
    inserted = [t for t, s in zip(tokens, sampled, strict=True) if not s]
    assert tokenizer.decode(inserted) == "\nT:\n5<eos>\nA:\n"
    assert (
        logprobs[torch.tensor(sampled).bool()].eq(-0.25).all() and logprobs[~torch.tensor(sampled).bool()].eq(0).all()
    )
    assert rollout.completions[0][0]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}


def test_agents_that_raise_or_hang_are_skipped_and_the_others_kept(tokenizer):
    async def agent(client, row):
        await client.chat.completions.create(model="policy", messages=row["prompt"])
        if row["n"] == 2:
            raise KeyError("the agent's own bug")
        return 1.0

    rollout, stats = _run(tokenizer, agent)
    assert sorted(i for i, _ in stats.failures) == [2, 3] and isinstance(stats.failures[0][1], KeyError)
    assert rollout.columns["agent_reward"] == [1.0, 1.0, None, None]
    assert "the agent's own bug" in rollout.columns["agent_error"][2]

    async def hangs(client, row):
        await client.chat.completions.create(model="policy", messages=row["prompt"])
        if row["n"] == 2:
            await asyncio.sleep(60)
        return 1.0

    start = time.perf_counter()
    rollout, stats = _run(tokenizer, hangs, limits=AgentLimits(timeout=5.0))
    assert time.perf_counter() - start < 30 and "agent_timeout=5.0" in str(stats.failures[0][1])
    assert [i for i, _ in stats.failures] == [2, 3] and rollout.columns["agent_reward"] == [1.0, 1.0, None, None]


def test_a_call_timeout_raises_the_sdk_error_and_a_retry_neither_forks_nor_duplicates(tokenizer):
    attempts = []

    async def agent(client, row):
        for _ in range(5):
            try:
                return float(
                    len((await client.chat.completions.create(model="policy", messages=row["prompt"])).choices)
                )
            except openai.APITimeoutError:
                attempts.append(row["n"])
        return None

    sample = _scripted(tokenizer, lambda context: "ok", first_delay=1.5)
    rollout, stats = _run(tokenizer, agent, rows=ROWS[:1], g=1, limits=AgentLimits(call_timeout=0.4), sample=sample)
    assert attempts and not stats.failures  # it timed out at least once, then got its answer
    assert len(rollout) == 1 and rollout.sampled_mask.sum() == 3  # "ok" + end of turn, recorded once


def test_a_sampling_error_ends_every_agent_and_is_raised(tokenizer):
    ended = []

    async def agent(client, row):
        try:
            await client.chat.completions.create(model="policy", messages=row["prompt"])
        finally:
            ended.append(row["n"])
        return 1.0

    def broken(*args, **kwargs):
        raise RuntimeError("the backend died")

    with pytest.raises(RuntimeError, match="the backend died"):
        _run(tokenizer, agent, sample=broken)
    assert sorted(ended) == [1, 1, 2, 2]  # every agent task was ended (cancelled), none left running


def test_bad_calls_are_refused_with_a_message(tokenizer):
    errors = {}

    async def agent(client, row):
        for name, call in {
            "model": lambda: client.chat.completions.create(model="gpt-4o", messages=row["prompt"]),
            "stream": lambda: client.chat.completions.create(model="policy", messages=row["prompt"], stream=True),
            "n": lambda: client.chat.completions.create(model="policy", messages=row["prompt"], n=2),
            "schema": lambda: client.chat.completions.create(model="policy", messages=row["prompt"],
                                                             tools=[{"type": "function", "function": {"name": "f"}}]),
        }.items():  # fmt: skip
            with pytest.raises(ValueError) as info:
                await call()
            errors[name] = str(info.value)
        with pytest.raises(NotImplementedError, match=r"chat.completions.create"):
            client.responses.create(model="policy", input="hi")
        await client.chat.completions.create(model="policy", messages=row["prompt"])
        return 1.0

    _, stats = _run(tokenizer, agent, rows=ROWS[:1], g=1)
    assert not stats.failures
    assert "it serves 'policy'" in errors["model"] and "stream=True" in errors["stream"] and "n=2" in errors["n"]
    assert "(f) has no schema" in errors["schema"]


def test_an_agent_must_be_a_coroutine_function():
    def agent(client, row):
        return 1.0

    with pytest.raises(TypeError, match="coroutine function"):
        check_agent(agent)
    assert check_agent("tests.rollout.test_agent_client._async_agent") is _async_agent


async def _async_agent(client, row):
    return None
