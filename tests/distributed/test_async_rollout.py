"""``async_rollout`` under DDP (2 gloo ranks): each rank samples its own next rollout in its own background thread,
with no collective there; each trains on the prompts of the synchronous run, and the ranks' adapters stay equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def test_dist_ddp_ranks_sample_ahead_apart_and_train_on_the_synchronous_prompts(tmp_path: Path):
    run_ranks([str(tmp_path)], tmp_path, timeout=300, worker="tests.distributed.async_worker")
    runs = {(name, r): json.loads((tmp_path / f"{name}-rank{r}.json").read_text())
            for name in ("sync", "async") for r in (0, 1)}  # fmt: skip
    for r in (0, 1):
        sync, ahead = runs["sync", r], runs["async", r]
        assert [s["prompts"] for s in ahead["steps"]] == [s["prompts"] for s in sync["steps"]]
        assert ahead["global_step"] == sync["global_step"] == 4
        assert [s["staleness"] for s in ahead["steps"]] == [0.0, 1.0, 0.0, 1.0]  # 2 batches per rank and epoch
        assert ahead["threads"] == ["MainThread", "lightning_grpo-rollout-ahead"] and sync["threads"] == ["MainThread"]
    assert runs["async", 0]["steps"][0]["prompts"] != runs["async", 1]["steps"][0]["prompts"]  # each rank its own
    adapters = [torch.load(tmp_path / f"async-rank{r}.pt") for r in (0, 1)]
    assert all(torch.equal(adapters[0][name], adapters[1][name]) for name in adapters[0])  # DDP kept them equal
