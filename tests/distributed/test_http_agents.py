"""``agent=`` over HTTP on 2 gloo ranks: under DDP each rank its own rows and its own server, ranks with different
row counts stay in step; under FSDP2 the combination is refused with a message."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.launch import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]
WORKER = "tests.distributed.http_agents_worker"


def _read(workdir, name):
    return [json.loads((workdir / f"{name}-rank{rank}.json").read_text()) for rank in (0, 1)]


def test_dist_ddp_agents_each_rank_its_rows_and_server(tmp_path):
    run_ranks(["ddp", str(tmp_path)], tmp_path, timeout=300, worker=WORKER)  # a hang fails here
    ranks = _read(tmp_path, "ddp")
    assert [r["rows"] for r in ranks] == [[8, 8], [16, 16]]  # rank 1's trajectories have 2 rows each
    assert len(ranks[0]["ports"]) >= 1 and not set(ranks[0]["ports"]) & set(ranks[1]["ports"])  # own servers
    assert all(not r["listening"] and r["threads_after"] == r["threads_before"] for r in ranks)  # all closed
    assert [r["optimizer_steps"] for r in ranks] == [8, 8]  # 2 iterations x 4 mini-batches on both ranks (2 idle on 0)
    adapters = [torch.load(tmp_path / f"adapter-rank{rank}.pt") for rank in (0, 1)]
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])  # gradients paired every step


def test_dist_fsdp2_refuses_agents_with_a_message(tmp_path):
    run_ranks(["fsdp", str(tmp_path)], tmp_path, timeout=300, worker=WORKER)
    assert all("agent= under FSDP2" in r["message"] and "DDP" in r["message"] for r in _read(tmp_path, "fsdp"))
