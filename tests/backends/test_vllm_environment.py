"""The CPU KV cache size of each vLLM engine is its own ``cpu_kv_cache_gb``; the user's environment value wins."""

from __future__ import annotations

import os

import pytest

from lightning_grpo.backends import VLLMConfig
from lightning_grpo.backends.vllm.start import engine_environment


@pytest.fixture
def clean_environment(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # restored after the test, as is the next
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr("lightning_grpo.backends.vllm.start._SET_BY_US", {})


@pytest.mark.usefixtures("clean_environment")
def test_a_second_engine_of_the_process_gets_its_own_kv_cache_size(monkeypatch):
    engine_environment(VLLMConfig(cpu_kv_cache_gb=1))

    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    engine_environment(VLLMConfig(cpu_kv_cache_gb=3))  # with setdefault, the first engine's 1 stayed
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"


@pytest.mark.usefixtures("clean_environment")
def test_the_users_own_value_is_kept(monkeypatch):

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "5")
    engine_environment(VLLMConfig(cpu_kv_cache_gb=2))
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "5"
