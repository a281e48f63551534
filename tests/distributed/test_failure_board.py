"""The failure board and its watching thread on one process, over an in-memory store (no process group)."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from lightning_grpo import rank_failures
from lightning_grpo.rank_failures import FailureBoard, FailureRecord, FailureWatch, is_communication_error


def _boards(tmp_path, world_size=2):
    store = dist.HashStore()
    return [FailureBoard(dist.PrefixStore("fit/", store), r, world_size, tmp_path) for r in range(world_size)]


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_a_posted_record_is_read_back_from_the_store_and_from_the_folder(tmp_path):
    origin, peer = _boards(tmp_path)
    assert peer.count() == 0 and peer.records() == {}
    record = FailureRecord.of(_raised(ValueError("boom")), rank=1)
    origin.rank = 1
    origin.post(record)
    assert peer.count() == 1 and peer.records() == {1: record}
    assert record.cause == "ValueError: boom" and record.where == "outside the trainer's hooks"
    assert (tmp_path / "rank1.json").exists()
    peer.store = dist.PrefixStore("other/", dist.HashStore())  # the store gone: the folder still has it
    assert peer.records() == {1: record}


def test_the_watch_acknowledges_prints_and_caches_a_peers_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rank_failures, "POLL_S", 0.02)
    healthy, failing = _boards(tmp_path)
    failing.rank = 1
    watch = FailureWatch(healthy).start()
    try:
        failing.post(FailureRecord.of(_raised(ConnectionError("reward server down")), rank=1))
        assert failing.wait_for_acknowledgements(timeout=5.0)  # the watch read it
        deadline = time.monotonic() + 5.0
        while not watch.peers() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(watch.peers()) == [1]
    finally:
        watch.stop()
    assert "[rank 0] rank 1 failed in outside the trainer's hooks: ConnectionError: reward server down" in (
        capsys.readouterr().err
    )


def test_without_readers_the_origin_stops_waiting_at_its_bound(tmp_path):
    _, failing = _boards(tmp_path)
    start = time.monotonic()
    assert not failing.wait_for_acknowledgements(timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    ("error", "broken"),
    [
        (RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1"), True),
        (dist.DistBackendError("NCCL communicator was aborted"), True),
        (ValueError("a reward function raised"), False),
    ],
)
def test_a_broken_collective_is_told_from_a_failure_of_ones_own(error, broken):
    assert is_communication_error(error) is broken
    chained = RuntimeError("while stepping")
    chained.__cause__ = error
    assert is_communication_error(chained) is broken
