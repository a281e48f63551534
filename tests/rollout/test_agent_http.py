"""Agents over HTTP (``agent_transport="http"``): the loopback server gives the same trajectories as the in-process
client, refuses bad requests with a status and a message, does not fork a trajectory on SDK retries, and leaves no
port or task behind (docs/agents.md, "Agents over HTTP")."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import openai
import pytest
import torch

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.rollout.agent_client import AgentLimits, agent_env, run_agents
from lightning_grpo.rollout.agent_client.client import loopback_http_client
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing.agents import short_turn_model
from tests.rollout.test_agent_client import _scripted

ROWS = [
    {"prompt": [{"role": "user", "content": "hi"}], "n": 1},
    {"prompt": [{"role": "user", "content": "yo"}], "n": 2},
]
HTTP = AgentLimits(transport="http")
ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA}}
]


def _run(tokenizer, agent, limits=HTTP, *, g=2, rows=ROWS, sample=None, max_new_tokens=60):
    torch.manual_seed(0)
    settings = SamplingSettings(num_generations=g, max_new_tokens=max_new_tokens)
    return run_agents(short_turn_model(tokenizer), tokenizer, agent, rows, settings, HermesToolCallParser(),
                      max_prompt_length=200, limits=limits, sample=sample)  # fmt: skip


def _closed(url):
    """Whether nothing listens at ``url``'s port any more."""
    port = int(str(url).rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def _three_turns(client, row):
    """Multi-turn with tools and an edited history: continued and new branches."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    messages += [first.choices[0].message, {"role": "user", "content": "more"}]
    await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
    return float(row["n"])


def test_http_and_in_process_give_identical_trajectories(tokenizer):
    # a window long enough that HTTP's latency does not split a batch (the batches decide what is sampled)
    a, stats_a = _run(tokenizer, _three_turns, AgentLimits(window=1.0))
    b, stats_b = _run(tokenizer, _three_turns, AgentLimits(window=1.0, transport="http"))
    assert not stats_a.failures and not stats_b.failures and len(a) == len(b) == 8  # 2 branches per trajectory
    assert stats_a.batches == stats_b.batches
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampled_mask", "group_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=0)
    assert a.columns["agent_reward"] == b.columns["agent_reward"]
    assert a.columns["agent_trajectory"] == b.columns["agent_trajectory"]


def test_bad_requests_are_refused_with_a_status_and_a_message(tokenizer):
    seen = {}

    async def agent(client, row):
        if row["n"] == 2:
            return await client.chat.completions.create(model="policy", messages=row["prompt"]) and 1.0
        base, key = str(client.base_url).rstrip("/"), client.api_key
        auth = {"Authorization": f"Bearer {key}"}
        async with loopback_http_client(4) as http:
            post = lambda body, headers=auth: http.post(f"{base}/chat/completions", content=body, headers=headers)  # noqa: E731
            chat = json.dumps({"model": "policy", "messages": row["prompt"]})
            seen["no key"] = await post(chat, {})
            seen["unknown key"] = await post(chat, {"Authorization": "Bearer sk-not-a-trajectory"})
            seen["models"] = await http.get(f"{base}/models", headers=auth)
            seen["models without key"] = await http.get(f"{base}/models")
            seen["other model"] = await post(json.dumps({"model": "gpt-4o", "messages": row["prompt"]}))
            seen["not json"] = await post("hello")
            seen["no messages"] = await post(json.dumps({"model": "policy", "prompt": "hi"}))
            seen["bad role"] = await post(json.dumps({"model": "policy", "messages": [{"role": "x", "content": "a"}]}))
            seen["stream"] = await post(json.dumps({"model": "policy", "messages": row["prompt"], "stream": True}))
            seen["ok"] = await post(chat)
        with pytest.raises(openai.NotFoundError, match="it serves 'policy'"):
            await client.chat.completions.create(model="gpt-4o", messages=row["prompt"])
        return 1.0

    rollout, stats = _run(tokenizer, agent, g=1)
    assert not stats.failures and len(rollout) == 2  # one call per trajectory was answered
    status = {name: response.status_code for name, response in seen.items()}
    assert status == {"no key": 401, "unknown key": 401, "models": 200, "models without key": 401,
                      "other model": 404, "not json": 400, "no messages": 400, "bad role": 400, "stream": 400,
                      "ok": 200}  # fmt: skip
    message = {name: response.json().get("error", {}).get("message", "") for name, response in seen.items()}
    assert "trajectory key" in message["no key"] and "it serves 'policy'" in message["other model"]
    assert "'model'" in message["no messages"] and "'messages'" in message["no messages"]
    assert "allowed roles" in message["bad role"] and "stream=True" in message["stream"]
    assert [m["id"] for m in seen["models"].json()["data"]] == ["policy"]


def test_sdk_retries_do_not_fork_a_trajectory(tokenizer):
    """A client that gives up on a slow answer and retries (same body, ``x-stainless-retry-count`` 1, 2, ...) gets
    the first request's answer: one recorded reply. A second call with retry count 0 is a new sample."""
    answers = []

    async def agent(client, row):
        impatient = client.with_options(timeout=0.3, max_retries=5)  # the first batch takes 1.5 s
        first = await impatient.chat.completions.create(model="policy", messages=row["prompt"])
        again = await client.chat.completions.create(model="policy", messages=row["prompt"])  # not a retry
        answers.extend([first.id, again.id])
        return 1.0

    sample = _scripted(tokenizer, lambda context: "ok", first_delay=1.5)
    rollout, stats = _run(tokenizer, agent, rows=ROWS[:1], g=1, sample=sample)
    assert not stats.failures and len(set(answers)) == 2
    assert len(rollout) == 2 and rollout.sampled_mask.sum() == 6  # two replies of "ok" + end of turn, none forked


def test_idempotency_keys_join_the_first_request(tokenizer):
    bodies = []

    async def agent(client, row):
        base, auth = str(client.base_url).rstrip("/"), {"Authorization": f"Bearer {client.api_key}"}
        async with loopback_http_client(4) as http:
            for retry in ("0", "1"):  # the same request sent twice, the second as the SDK's retry
                headers = {**auth, "Idempotency-Key": "stainless-python-retry-1", "x-stainless-retry-count": retry}
                response = await http.post(f"{base}/chat/completions", headers=headers,
                                           json={"model": "policy", "messages": row["prompt"]})  # fmt: skip
                bodies.append(response.json())
        return 1.0

    rollout, _ = _run(tokenizer, agent, rows=ROWS[:1], g=1, sample=_scripted(tokenizer, lambda context: "ok"))
    assert bodies[0] == bodies[1] and len(rollout) == 1 and rollout.sampled_mask.sum() == 3


def test_a_port_in_use_is_a_clear_error(tokenizer):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"port {port} on 127.0.0.1 is in use.*agent_http_port, or 0"):
            _run(tokenizer, _three_turns, AgentLimits(transport="http", port=port))


def test_the_server_and_agent_tasks_end_with_the_rollout_and_on_an_error(tokenizer):
    urls, threads = [], threading.active_count()

    async def agent(client, row):
        urls.append(client.base_url)
        assert agent_env(client, {})["OPENAI_BASE_URL"] == str(client.base_url).rstrip("/")
        await client.chat.completions.create(model="policy", messages=row["prompt"])
        await asyncio.sleep(0 if row["n"] == 1 else 3600)  # never returns by itself: cancelled by the error
        return 1.0

    def broken_later(model, tok, request):
        raise RuntimeError("the backend died")

    with pytest.raises(RuntimeError, match="the backend died"):
        _run(tokenizer, agent, sample=broken_later)
    _run(tokenizer, _three_turns)
    assert urls and all(_closed(url) for url in urls)
    assert threading.active_count() == threads  # no server or sampling thread left


def test_agent_env_refuses_the_in_process_client(tokenizer):
    async def agent(client, row):
        agent_env(client)

    with pytest.raises(
        RuntimeError, match=r"another process: set GRPOConfig\(agents=AgentConfig\(agent_transport='http'\)\)"
    ):
        _run(tokenizer, agent, AgentLimits(), rows=ROWS[:1], g=1)


@pytest.mark.timeout(120)
def test_256_concurrent_agents_on_loopback_complete_without_errors(tokenizer):
    """256 agents calling at once (the scripted sampler: the HTTP path is what is loaded), bounded by timeouts."""
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "n": i} for i in range(32)]

    async def agent(client, row):
        reply = await client.chat.completions.create(model="policy", messages=row["prompt"])
        return float(reply.choices[0].message.content == "ok")

    limits = AgentLimits(transport="http", call_timeout=30.0, timeout=60.0)  # a stuck call fails the run, not hangs
    sample = _scripted(tokenizer, lambda context: "ok")
    rollout, stats = _run(tokenizer, agent, limits, g=8, rows=rows, sample=sample)
    assert not stats.failures and len(rollout) == 256 and stats.batches == [256]  # one batch: every agent waited
    assert rollout.columns["agent_reward"] == [1.0] * 256
