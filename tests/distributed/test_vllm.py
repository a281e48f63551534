"""The colocated vLLM backend on 2 gloo ranks: DDP (an engine per rank) and FSDP2 (the adapter gathered before each
sync), with the log-probs exact on every rank and the ranks' adapters equal (docs/vllm.md, distributed)."""

from __future__ import annotations

import json

import pytest

from tests.backends.vllm_helpers import needs_vllm
from tests.distributed.launch import run_ranks

pytestmark = [needs_vllm, pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_rank_samples_its_own_prompts_with_its_own_engine(tmp_path, strategy):
    run_ranks([strategy, str(tmp_path)], tmp_path, timeout=400, worker="tests.distributed.vllm_worker")
    ranks = [json.loads((tmp_path / f"vllm-{strategy}-rank{r}.json").read_text()) for r in (0, 1)]
    for result in ranks:
        assert len(result["diff_max"]) == 2 and max(result["diff_max"]) < 1e-4  # its engine holds the synced adapter
        assert all(seconds > 0 for seconds in result["sync"]) and result["engine_closed"]
    assert ranks[0]["prompts"] != ranks[1]["prompts"]  # each rank its own prompts (groups never straddle ranks)
    assert ranks[0]["adapter"] == ranks[1]["adapter"]  # one model: the update is the same on both ranks
