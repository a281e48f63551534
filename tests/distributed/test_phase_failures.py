"""A failure on one rank in any phase of an iteration stops both gloo ranks within seconds, each naming the cause
(:mod:`tests.distributed.phase_failures_worker`: DDP and FSDP2, one forked process group per scenario)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import free_port, run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600), pytest.mark.xdist_group("phase-failures")]
WORKER = "tests.distributed.phase_failures_worker"
WITHIN_S = 60.0
#: Scenario -> (failing rank, its cause, where it failed).
DDP_FAILURES = {
    "sync": (1, "RuntimeError: sync boom on rank 1", "training_step"),
    "score": (1, "ConnectionError: reward server http://127.0.0.1:9/score refused", "score_rollout"),
    "reward-model": (1, "raised OutOfMemoryError: reward model boom on rank 1", "RewardFunctions.__call__"),
    "advantages": (1, "ValueError: advantages boom on rank 1", "training_step"),
    "logprobs": (1, "RuntimeError: reference pass boom on rank 1", "fixed_logprobs"),
    "update": (1, "ValueError: loss boom on rank 1", "_accumulate"),
    "guard": (1, "ValueError: guard boom on rank 1", "_accumulate"),
    "checkpoint": (0, "OSError: disk boom on rank 0", "ModelCheckpoint.on_train_batch_end"),
    "export": (0, "RuntimeError: export boom on rank 0", "AdapterExport.on_train_batch_end"),
    "callback": (1, "ValueError: GroupRewardStats boom on rank 1", "GroupRewardStats.on_train_batch_end"),
}
#: Under FSDP2 the same phases (the checkpoint and the export fail on rank 1: every rank writes or gathers there).
FSDP_ONLY = {
    "sampling-fsdp": (1, "RuntimeError: sampling forward boom on rank 1", "sample_tokens"),
    "checkpoint-fsdp": (1, "ValueError: checkpoint state boom on rank 1", "on_save_checkpoint"),
    "export-fsdp": (1, "RuntimeError: export boom on rank 1", "AdapterExport.on_train_batch_end"),
}
FAILURES = {
    **DDP_FAILURES,
    **{f"{name}-fsdp": failure for name, failure in DDP_FAILURES.items() if name not in ("checkpoint", "export")},
    **FSDP_ONLY,
}
SCENARIOS = [*FAILURES, "sampling", "killed"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launch of every scenario, each on a port of its own."""
    workdir = tmp_path_factory.mktemp("phase-failures")
    run_ranks([str(workdir), *(f"{name}:{free_port()}" for name in SCENARIOS)], workdir, timeout=500, worker=WORKER)
    return workdir


def _read(workdir: Path, name: str, rank: int) -> dict:
    path = workdir / f"{name}-rank{rank}.json"
    assert path.exists(), f"{name}: rank {rank} wrote nothing"
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", list(FAILURES))
def test_dist_a_failure_in_any_phase_stops_both_ranks_naming_it(runs, name):
    failing, cause, where = FAILURES[name]
    for rank in (0, 1):
        result = _read(runs, name, rank)
        assert result["error"] == "RankFailureError", result
        assert result["end"] - result["start"] < WITHIN_S, result
        message = result["message"]
        assert f"the training failed on rank {failing} of 2" in message and f"this is rank {rank}" in message, message
        assert f"rank {failing} (" in message and cause in message and where in message, message
        assert list(result["causes"]) == [str(failing)], result["causes"]


def test_dist_a_sampling_failure_under_ddp_stays_the_rollouts_agreed_error(runs):
    for rank in (0, 1):
        result = _read(runs, "sampling", rank)
        assert result["error"] == "RankFailureError" and result["end"] - result["start"] < WITHIN_S, result
        assert "the rollout failed on rank 1 of 2" in result["message"], result["message"]
        assert "rank 1: ValueError: sampling boom on rank 1" in result["message"], result["message"]


def test_dist_a_peer_killed_without_a_word_is_named_as_such(runs):
    result = _read(runs, "killed", 0)
    assert result["error"] == "RankFailureError" and result["end"] - result["start"] < WITHIN_S, result
    assert "no rank recorded a cause" in result["message"] and result["causes"] == {}, result
    assert not (runs / "killed-rank1.json").exists()  # rank 1 exited inside the fit
