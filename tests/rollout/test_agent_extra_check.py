"""``GRPOModule(agent=...)`` checks for ``openai`` when it is built, not in its first rollout."""

from __future__ import annotations

import sys

import pytest

from lightning_grpo.extras import MissingExtraError, install_hint
from lightning_grpo.rollout.agent_client import module_agent


async def _agent(client, row):
    return 1.0


def test_an_agent_without_openai_is_refused_when_the_module_is_built(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(MissingExtraError, match=r'GRPOModule\(agent=...\) needs openai.*pip install -e "\.\[openai\]"'):
        module_agent(_agent, None, None)


def test_the_install_line_resolves_from_a_clone_or_a_wheel():
    assert install_hint("data", "quant") == (
        'pip install ".[data,quant]" in a clone of lightning-grpo (pip install -e ".[data,quant]" for an editable '
        'install; from a built wheel: pip install "<the wheel file>[data,quant]")'
    )
    with pytest.raises(ValueError, match="the extras are"):
        install_hint("plots")
