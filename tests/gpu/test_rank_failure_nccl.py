"""Under NCCL a failure on one rank stops both ranks within seconds, naming it: the watch aborts the process groups
(no peer exit wakes an NCCL collective). Needs two CUDA devices: NCCL refuses two ranks on one GPU."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.launch import free_port, run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (one NCCL rank each)"),
]


def test_nccl_a_loss_failing_on_one_rank_stops_both_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASE_ACCELERATOR", "gpu")
    run_ranks(
        [str(tmp_path), f"update:{free_port()}"],
        tmp_path,
        timeout=300,
        worker="tests.distributed.phase_failures_worker",
    )
    for rank in (0, 1):
        result = json.loads((tmp_path / f"update-rank{rank}.json").read_text())
        assert result["error"] == "RankFailureError" and result["end"] - result["start"] < 60, result
        assert "rank 1 (" in result["message"] and "ValueError: loss boom on rank 1" in result["message"], result
