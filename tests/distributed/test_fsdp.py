"""FSDP2-only behaviour on 2 ranks: uneven sampling lengths, gathered generation, bf16 base weights, bad meshes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def _ranks(workdir: Path, name: str) -> list[dict]:
    return [json.loads((workdir / f"{name}-rank{rank}.json").read_text()) for rank in (0, 1)]


def test_dist_fsdp_uneven_completion_lengths_across_ranks_do_not_hang(fsdp_run):
    # Rank 0 samples 2 new tokens, rank 1 samples 12: with synced_gpus=True rank 0 keeps stepping until rank 1 ends.
    # (A hang would have failed the launch at its timeout.)
    rank0, rank1 = _ranks(fsdp_run, "uneven")
    for gather in ("True", "False"):
        assert [b["width"] for b in rank0[gather]] == [2, 2]
        assert [b["width"] for b in rank1[gather]] == [12, 12]


def test_dist_fsdp_gathered_generation_samples_the_same_completions(fsdp_run):
    for rank in _ranks(fsdp_run, "uneven"):
        gathered = [b["completions"] for b in rank["True"]]
        per_layer = [b["completions"] for b in rank["False"]]
        assert gathered == per_layer  # same weights, same seeds: only where the all-gathers happen differs


def test_dist_fsdp_bf16_base_weights_with_a_float32_adapter_train(fsdp_run):
    for rank in _ranks(fsdp_run, "bf16"):
        assert rank["dtypes"] == ["torch.bfloat16", "torch.float32"]
        assert rank["moved"] > 0 and abs(rank["loss"]) < 1e3


def test_dist_fsdp_tensor_parallel_mesh_is_refused(fsdp_run):
    for rank in _ranks(fsdp_run, "refused"):
        assert "tensor_parallel_size=2" in rank["message"]
        assert "data_parallel_size: N, tensor_parallel_size: 1" in rank["message"]
