"""The vLLM multi-turn benchmark runs at minimal size: turns of the model's own lengths, a ratio per sampled token."""

from __future__ import annotations

import pytest

from benchmarks.multi_turn_vllm import format_table, main
from tests.backends.vllm_helpers import needs_vllm

ARGS = ["--hidden-size", "64", "--layers", "1", "--prompts", "1", "--generations", "2", "--repeats", "1"]


def _check(result) -> None:
    assert 2 <= result.turns <= 3  # the model ended its turns (the benchmark refuses fewer than 2 on average)
    assert result.multi_tokens > 0 and abs(result.single_tokens - result.multi_tokens) <= 0.5  # as many, rounded
    low, median, high = result.ratio[1], result.ratio[0], result.ratio[2]
    assert 0 < low <= median <= high and result.multi_seconds > 0 and result.single_seconds > 0


def test_the_hf_backend_at_default_settings_runs_the_model_driven_task(capsys):
    (hf,) = main([*ARGS, "--backends", "hf", "--max-new-tokens", "96"])
    assert hf.backend.startswith("hf")
    _check(hf)
    assert format_table([hf]).splitlines()[0] in capsys.readouterr().out


@needs_vllm
@pytest.mark.timeout(600)
def test_the_vllm_backend_runs_the_same_task():
    (vllm,) = main([*ARGS, "--backends", "vllm", "--max-new-tokens", "96"])
    assert vllm.backend.startswith("vllm")
    _check(vllm)
