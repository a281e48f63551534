"""GRPOModule(agent=...) with ``agent_transport="http"``: a fit trains through the loopback server, and the server,
its port and every agent task are gone at the end of fit and after an exception (docs/agents.md, "Agents over HTTP")."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from lightning_grpo import GRPOConfig
from lightning_grpo.config import AgentConfig, UpdateConfig
from tests.conftest import make_trainer
from tests.module.test_agent import BATCH, _module, branching_agent


def _listening(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_fit_over_http_trains_and_leaves_no_server_or_thread(tokenizer):
    urls, threads = [], threading.active_count()

    async def agent(client, row):
        urls.append(str(client.base_url))
        assert _listening(urls[-1]) and client.api_key.startswith("sk-trajectory-")
        return await branching_agent(client, row)

    module = _module(
        tokenizer,
        agent=agent,
        agents=AgentConfig(agent_transport="http"),
        update=UpdateConfig(mini_batch_size=4, micro_batch_size=2),
    )
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
    make_trainer(max_steps=4).fit(module, torch.utils.data.DataLoader([BATCH, BATCH], batch_size=None))
    assert module.trainer.global_step == 4 and len(set(urls)) == 2  # 2 rollouts, each its own server
    assert any(not torch.equal(p, before[n]) for n, p in module.policy.named_parameters() if p.requires_grad)
    assert not any(_listening(url) for url in urls) and threading.active_count() == threads


def test_an_exception_in_the_rollout_ends_the_server_and_every_agent(tokenizer):
    urls, ended, threads = [], [], threading.active_count()

    async def agent(client, row):
        urls.append(str(client.base_url))
        try:
            await client.chat.completions.create(model="policy", messages=row["prompt"])
        finally:
            ended.append(row["target"])
        return 1.0

    module = _module(tokenizer, agent=agent, agents=AgentConfig(agent_transport="http"))

    class Broken(RuntimeError):
        pass

    def broken(*args, **kwargs):
        raise Broken("the backend died")

    module.rollout_backend.session = lambda *args, **kwargs: _BrokenSession(broken)
    with pytest.raises(Broken):
        make_trainer(max_steps=1).fit(module, torch.utils.data.DataLoader([BATCH], batch_size=None))
    assert sorted(ended) == [1, 1, 2, 2] and urls and not any(_listening(url) for url in urls)
    assert threading.active_count() == threads


class _BrokenSession:
    def __init__(self, sample):
        self.sample = sample

    def __call__(self, *args, **kwargs):
        return self.sample(*args, **kwargs)

    def close(self):
        pass


def test_agent_transport_is_checked():
    with pytest.raises(ValueError, match=r"agent_transport.*'in_process', 'http'"):
        GRPOConfig(agents=AgentConfig(agent_transport="tcp"))
    with pytest.raises(ValueError, match="agent_http_port"):
        GRPOConfig(agents=AgentConfig(agent_http_port=70000))
