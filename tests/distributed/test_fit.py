"""Short 2-rank fits under DDP and FSDP2: sampling, KL, gradient checkpointing, clipping, a scheduler; checkpoints
that hold the adapter only and resume exactly; the data sampler; the PEFT export.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from tests.distributed.builders import fit_module

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STRATEGIES = ["ddp", "fsdp"]
ADAPTER_TENSORS = 28  # 2 layers x 7 linear layers x (lora_A, lora_B)


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def _ranks(workdir: Path, name: str) -> list[dict]:
    return [json.loads((workdir / f"{name}-rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dist_resumed_run_matches_an_uninterrupted_one(request, strategy):
    workdir = request.getfixturevalue(f"{strategy}_run")
    straight, resumed = torch.load(workdir / "straight.pt"), torch.load(workdir / "resumed.pt")
    assert len(straight) == ADAPTER_TENSORS
    assert _max_abs_diff(straight, resumed) <= 1e-6
    for rank in _ranks(workdir, "resumed"):
        assert rank["global_step"] == 12
        assert rank["lr"] == pytest.approx(1e-2 * 0.5**3)  # the scheduler state came back too


def test_dist_ddp_checkpoint_holds_only_the_adapter(ddp_run):
    checkpoint = torch.load(ddp_run / "resumed" / "last.ckpt", weights_only=True)
    assert len(checkpoint["state_dict"]) == ADAPTER_TENSORS
    assert all("lora_" in key for key in checkpoint["state_dict"])
    assert checkpoint["optimizer_states"] and checkpoint["lr_schedulers"] and checkpoint["global_step"] == 4


def test_dist_fsdp_distributed_checkpoint_holds_only_the_adapter(fsdp_run):
    path = fsdp_run / "resumed" / "last.ckpt"  # ModelParallelStrategy writes a directory: one shard file per rank
    assert path.is_dir() and (path / "meta.pt").is_file() and len(list(path.glob("*.distcp"))) == 2
    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    weights = [key for key in keys if key.startswith("state_dict.")]
    assert len(weights) == ADAPTER_TENSORS and all("lora_" in key for key in weights)
    assert any(key.startswith("optimizer_0.state.") for key in keys)
    assert torch.load(path / "meta.pt", weights_only=True)["global_step"] == 4


def test_dist_fsdp_resumes_from_a_single_file_checkpoint(fsdp_run):
    path = fsdp_run / "resumed-full" / "last.ckpt"  # save_distributed_checkpoint=False: gathered on rank zero
    checkpoint = torch.load(path, weights_only=True)
    assert len(checkpoint["state_dict"]) == ADAPTER_TENSORS
    straight, resumed = torch.load(fsdp_run / "straight.pt"), torch.load(fsdp_run / "resumed-full.pt")
    assert _max_abs_diff(straight, resumed) <= 1e-6


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dist_sampler_gives_ranks_different_prompts_and_the_same_batches(request, strategy):
    ranks = _ranks(request.getfixturevalue(f"{strategy}_run"), "fit")
    assert [r["global_step"] for r in ranks] == [12, 12]
    assert [len(r["batches"]) for r in ranks] == [3, 3]  # 3 GRPO iterations of 4 optimizer steps
    epoch0 = [[p for b in r["batches"] if b["epoch"] == 0 for p in b["prompts"]] for r in ranks]
    assert len(epoch0[0]) == len(epoch0[1]) == 4
    assert not set(epoch0[0]) & set(epoch0[1]), "ranks must not share prompts within an epoch"
    all_prompts = {f"{i % 10}+{(i * 3) % 10}=" for i in range(8)}
    assert set(epoch0[0]) | set(epoch0[1]) == all_prompts


def test_dist_ddp_and_fsdp2_train_the_same_adapter(ddp_run, fsdp_run):
    ddp, fsdp = torch.load(ddp_run / "straight.pt"), torch.load(fsdp_run / "straight.pt")
    assert _max_abs_diff(ddp, fsdp) <= 1e-6


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dist_export_equals_a_single_process_export_of_the_same_weights(request, strategy, tmp_path):
    workdir = request.getfixturevalue(f"{strategy}_run")
    module = fit_module()
    trained = torch.load(workdir / "straight.pt")
    with torch.no_grad():
        for name, param in module.policy.named_parameters():
            if param.requires_grad:
                param.copy_(trained[name])
    single = module.export_adapter(tmp_path / "single")

    exported, expected = workdir / "adapter", single
    got_weights = load_file(exported / "adapter_model.safetensors")
    want_weights = load_file(expected / "adapter_model.safetensors")
    assert set(got_weights) == set(want_weights)
    assert all(torch.equal(got_weights[k], want_weights[k]) for k in want_weights)
    got_config, want_config = (json.loads((d / "adapter_config.json").read_text()) for d in (exported, expected))
    for config in (got_config, want_config):  # peft writes target_modules from a set: order varies by process
        config["target_modules"] = sorted(config["target_modules"])
    assert got_config == want_config


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dist_a_logged_run_exports_and_draws_in_its_folder(request, strategy):
    """A CSV logger, the default callbacks and an adapter export (the CLI's set-up): both ranks finish (a callback
    reading ``Trainer.log_dir`` on rank zero alone, a broadcast, hung here) and the files land in the run folder."""
    workdir = request.getfixturevalue(f"{strategy}_run")
    assert [rank["global_step"] for rank in _ranks(workdir, "logged")] == [4, 4]
    run = workdir / "logged" / "run" / "version_0"
    assert (run / "metrics.csv").is_file() and (run / "adapter" / "final" / "adapter_config.json").is_file()
    assert not (workdir / "logged" / "run" / "version_1").exists()  # one run folder, not one per rank
