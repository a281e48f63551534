"""One rank's rollout fails or is empty, on 2 gloo ranks under DDP: no rank waits on a dead peer, every rank's error
names the failing rank and its cause, a rank whose agents make no chat call trains on an empty batch, and
``GRPOConfig.faults.collective_timeout_s`` reaches the process group (:mod:`tests.distributed.rank_failures_worker`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]
WORKER = "tests.distributed.rank_failures_worker"
SCENARIOS = ["no-call", "agent-raises", "env-raises", "mcp-dies", "env-raises-fsdp"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launch of every scenario (a hang fails it at its timeout; a rank that exits with an error fails it)."""
    workdir = tmp_path_factory.mktemp("rank-failures")
    run_ranks([str(workdir), *SCENARIOS], workdir, timeout=400, worker=WORKER)
    return workdir


def _read(workdir: Path, name: str) -> list[dict]:
    return [json.loads((workdir / f"{name}-rank{rank}.json").read_text()) for rank in (0, 1)]


def _agreed_failure(workdir: Path, name: str, cause: str) -> list[dict]:
    """Both ranks raised the agreed error naming rank 1 and ``cause``; rank 1's is chained to its own exception."""
    ranks = _read(workdir, name)
    for rank, result in enumerate(ranks):
        assert result["error"] == "RankFailureError", result
        assert "the rollout failed on rank 1 of 2" in result["message"] and f"this is rank {rank}" in result["message"]
        assert f"rank 1: {cause}" in result["message"], result["message"]
    assert ranks[0]["cause"] is None and ranks[1]["cause"] is not None  # only the failing rank has its own cause
    return ranks


def test_dist_rank_whose_agents_make_no_call_trains_on_an_empty_batch(runs):
    ranks = _read(runs, "no-call")
    assert [r["rows"] for r in ranks] == [[0], [2]]  # rank 0: an empty batch, not an error
    assert [r["global_step"] for r in ranks] == [1, 1] and [r["optimizer_steps"] for r in ranks] == [1, 1]
    adapters = [torch.load(runs / f"no-call-adapter-rank{rank}.pt") for rank in (0, 1)]
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])  # the gradients were paired


def test_dist_collective_timeout_reaches_the_process_group(runs):
    assert [r["timeout_s"] for r in _read(runs, "no-call")] == [60.0, 60.0]  # GRPOConfig.faults.collective_timeout_s


def test_dist_agent_raising_on_one_rank_stops_every_rank_naming_it(runs):
    ranks = _agreed_failure(runs, "agent-raises", "NoAgentCallError: no agent execution made a chat call")
    assert all("ValueError('agent boom on rank 1')" in r["message"] for r in ranks)


def test_dist_tool_server_dying_on_one_rank_stops_every_rank_naming_it(runs):
    ranks = _agreed_failure(runs, "mcp-dies", "MCPServerExitedError: the MCP stdio server")
    assert all("mcp_die_server.py" in r["message"] and "tool 'die'" in r["message"] for r in ranks)


@pytest.mark.parametrize("name", ["env-raises", "env-raises-fsdp"])
def test_dist_environment_raising_on_one_rank_stops_every_rank_naming_it(runs, name):
    ranks = _agreed_failure(runs, name, "EnvironmentFailedError: Environment RaisingEnv failed in step()")
    assert all("environment step failed on rank 1" in r["message"] for r in ranks)


@pytest.mark.parametrize("name", ["agent-raises", "env-raises", "mcp-dies", "env-raises-fsdp"])
def test_dist_failing_rank_cause_reaches_the_other_rank_before_either_exits(runs, name):
    rank0, rank1 = _read(runs, name)
    assert rank0["cause"] is None and rank0["message"].endswith(rank1["message"].split("\n", 1)[1])  # rank 1's cause
    # Each rank, after its error, waited for the other's error file: both were still running when they had it.
    assert rank0["peer"] is not None and rank1["peer"] is not None
    assert rank0["peer"]["message"] == rank1["message"] and rank1["peer"]["message"] == rank0["message"]
    assert abs(rank0["time"] - rank1["time"]) < 30.0  # the same step, not the gloo connection closing later


def test_dist_turn_loop_votes_pair_up_with_a_failure_in_any_turn(tmp_path):
    """FSDP2's turn loop: a failure in any turn answers the other rank's next question; no collective is unpaired."""
    run_ranks([str(tmp_path)], tmp_path, timeout=120, worker="tests.distributed.votes_worker")
    ranks = [json.loads((tmp_path / f"votes-rank{rank}.json").read_text()) for rank in (0, 1)]
    for name, turn in [("first-turn", 0), ("last-turn", 2)]:
        for rank, result in enumerate(ranks):
            assert result[name]["causes"] == {"1": f"RuntimeError: tool failed in turn {turn} on rank 1"}
            assert f"this is rank {rank}" in result[name]["message"]
        assert ranks[0][name]["own"] is None and ranks[1][name]["own"] == f"tool failed in turn {turn} on rank 1"
    for rank, result in enumerate(ranks):  # both failed: both named, each chained to its own error
        assert set(result["both-fail"]["causes"]) == {"0", "1"} and "ranks 0, 1 of 2" in result["both-fail"]["message"]
        assert result["both-fail"]["own"] == f"tool failed in turn 1 on rank {rank}"
        assert result["fine"] == {"returned": [0, 1, 2]}
        assert "empty on every one of the 2 ranks" in result["all-empty"]["message"]
