"""The claim behind the engine's seeding (docs/vllm.md, "Seeds"): vLLM draws a seeded request's noise row by row and
unseeded requests' noise in one batched call. Counted on the installed vLLM's own sampler functions."""

from __future__ import annotations

import pytest

from benchmarks.vllm_seeds import _op
from tests.backends.vllm_helpers import needs_vllm


@needs_vllm
@pytest.mark.parametrize("rows", [4, 16])
def test_per_request_generators_cost_calls_per_row_and_none_cost_a_constant(rows):
    seeded, batched = _op(rows, vocab=64, seeded=True, repeats=1), _op(rows, vocab=64, seeded=False, repeats=1)
    assert seeded["random_sample_aten_calls"] == 2 * rows + 4  # a select and an exponential_ per row
    assert batched["random_sample_aten_calls"] == 5  # one batched exponential_, whatever the rows
    assert seeded["forward_cpu_aten_calls"] > 4 * rows and batched["forward_cpu_aten_calls"] == 4
