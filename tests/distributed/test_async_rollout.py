"""``async_rollout`` under DDP (2 gloo ranks): each rank samples its own next rollout in its own background thread,
with no collective there; each trains on the prompts of the synchronous run, and the ranks' adapters stay equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def ddp_async_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank launch of :mod:`tests.distributed.async_worker`: the synchronous, async and failing fits."""
    workdir = tmp_path_factory.mktemp("ddp-async")
    run_ranks([str(workdir)], workdir, timeout=300, worker="tests.distributed.async_worker")
    return workdir


def test_dist_ddp_ranks_sample_ahead_apart_and_train_on_the_synchronous_prompts(ddp_async_run: Path):
    tmp_path = ddp_async_run
    runs = {
        (name, r): json.loads((tmp_path / f"{name}-rank{r}.json").read_text())
        for name in ("sync", "async")
        for r in (0, 1)
    }
    for r in (0, 1):
        sync, ahead = runs["sync", r], runs["async", r]
        assert [s["prompts"] for s in ahead["steps"]] == [s["prompts"] for s in sync["steps"]]
        assert ahead["global_step"] == sync["global_step"] == 4
        assert [s["staleness"] for s in ahead["steps"]] == [0.0, 1.0, 0.0, 1.0]  # 2 batches per rank and epoch
        assert ahead["threads"] == ["MainThread", "lightning_grpo-rollout-ahead"] and sync["threads"] == ["MainThread"]
    assert runs["async", 0]["steps"][0]["prompts"] != runs["async", 1]["steps"][0]["prompts"]  # each rank its own
    adapters = [torch.load(tmp_path / f"async-rank{r}.pt") for r in (0, 1)]
    assert all(torch.equal(adapters[0][name], adapters[1][name]) for name in adapters[0])  # DDP kept them equal


def test_dist_ddp_a_rollout_ahead_failing_on_one_rank_stops_every_rank_naming_it(ddp_async_run: Path):
    for r in (0, 1):
        result = json.loads((ddp_async_run / f"fail-rank{r}.json").read_text())
        assert result["raised"].startswith("RankFailureError: the rollout failed on rank 1 of 2")
        assert "rank 1 lost its server" in result["raised"] and result["closed"] and not result["alive"]
