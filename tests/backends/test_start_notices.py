"""A vLLM engine or server that starts says so first, with what it does meanwhile and about how long it takes."""

from __future__ import annotations

import sys

import lightning.fabric.utilities.rank_zero as rank_zero
import pytest

from lightning_grpo.backends.vllm import start
from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.backends.vllm_server.process import ServerError, ServerProcess


class _Stop(Exception):
    """Stops ``build_llm`` right after its announcement (before vLLM is imported)."""


@pytest.mark.parametrize(("eager", "compiles"), [(True, False), (False, True)])
def test_the_engine_announces_its_start_before_building(monkeypatch, eager, compiles):
    said: list[str] = []
    monkeypatch.setattr(rank_zero, "rank_zero_info", said.append)
    monkeypatch.setattr(start, "_scalar_kernels_under_default_capability", lambda: (_ for _ in ()).throw(_Stop()))
    with pytest.raises(_Stop):
        start.build_llm({"model": "m", "max_model_len": 8, "enforce_eager": eager}, VLLMConfig())
    (line,) = said
    assert line.startswith("vLLM engine: starting in this process (it loads the weights, sizes its KV cache")
    assert line.endswith("a few seconds for a tiny model on a CPU, 30 s to a few minutes for a real model on a GPU")
    assert ("CUDA graphs" in line) is compiles


def test_the_server_announces_its_start_and_where_its_output_goes(capsys):
    server = ServerProcess([], env={}, command=[sys.executable, "-c", "pass"])  # exits at once
    log = server.log_path
    with pytest.raises(ServerError, match="exited"):
        server.wait_ready("http://127.0.0.1:9", timeout=30)
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "vLLM server: starting `vllm serve` (it loads the model and warms up: usually 30 s to a few minutes, at most "
        f"start_timeout_s=30 s); its output goes to {log}"
    )
