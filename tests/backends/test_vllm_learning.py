"""The demo task learns when a colocated vLLM engine samples its rollouts (docs/vllm.md, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from lightning_grpo import demo
from tests.backends.vllm_helpers import needs_vllm
from tests.examples.learning_claims import assert_claims


@needs_vllm
@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(600)
def test_the_demo_learns_with_the_vllm_backend(tmp_path):
    """300 iterations of the demo with ``rollout_backend: vllm`` (its model with heads of 32, which vLLM's CPU
    attention needs): the exact-answer rate rises by 0.2 or more.

    ``python -m benchmarks.learning --cases demo_vllm`` (3 seeds x 3 CPU capabilities, docs/benchmarks.md): every run
    rose by 0.30 or more; the same model sampled by Hugging Face ``generate`` rises as much (0.30 for seed 0).
    """
    first, last, steps = demo.main(["--output-dir", str(tmp_path), "--rollout-backend", "vllm"])
    assert steps == 300
    assert_claims("demo_vllm", first, last)  # a rise of 0.2 or more
