"""Where a quantized base is placed before the Trainer exists: each rank's own GPU, read as Lightning reads it.

No GPU is needed: CUDA is patched to report four GPUs, and the launchers' environment variables are set by hand.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from lightning_grpo.policy import quantization
from lightning_grpo.policy.quantization import _device_map, local_rank

#: Variables by which Lightning's cluster environments recognise a launcher; each test starts with none of them.
_LAUNCHER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                       "MASTER_PORT", "LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK",
                       "JSM_NAMESPACE_SIZE")  # fmt: skip

TORCHRUN = {"LOCAL_RANK": "2", "RANK": "6", "WORLD_SIZE": "8", "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "job",
            "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}  # fmt: skip
#: What ``srun --ntasks-per-node=4`` sets for the third task of the second node; it sets no LOCAL_RANK.
SRUN = {"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2", "SLURM_PROCID": "6",
        "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "1234", "SLURM_JOB_NAME": "grpo",
        "SLURM_NODELIST": "node[0-1]"}  # fmt: skip
JSRUN = {"LSB_JOBID": "7", "LSB_DJOB_RANKFILE": "{rankfile}", "JSM_NAMESPACE_LOCAL_RANK": "3",
         "JSM_NAMESPACE_SIZE": "8"}  # fmt: skip


@pytest.fixture
def four_gpus(monkeypatch):
    """A process that sees four GPUs (current device 0, as before anyone calls ``set_device``) and no launcher."""
    for name in [*_LAUNCHER_VARIABLES, *(n for n in os.environ if n.startswith("SLURM_"))]:
        monkeypatch.setenv(name, "")  # recorded, so that what a cluster environment sets is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return monkeypatch


@pytest.mark.parametrize(
    ("variables", "device"),
    [
        ({}, 0),  # a single process
        (TORCHRUN, 2),
        (SRUN, 2),  # was 0: every srun rank loaded onto the first GPU
        ({**SRUN, "SLURM_JOB_NAME": "interactive"}, 0),  # Lightning's opt-out: not a SLURM launch
        ({**SRUN, **TORCHRUN, "LOCAL_RANK": "1"}, 1),  # torchrun inside an allocation: torchrun wins, as in Lightning
        (JSRUN, 3),
        ({"LOCAL_RANK": "1"}, 1),  # Lightning's own launcher (its spawned ranks set LOCAL_RANK)
    ],
)
def test_each_rank_places_its_base_on_its_local_gpu(four_gpus, tmp_path, variables, device):
    rankfile = tmp_path / "ranks"  # LSF's host list: the launch node, then the compute nodes
    rankfile.write_text(f"launch\n{socket.gethostname()}\n")
    for name, value in variables.items():
        four_gpus.setenv(name, value.format(rankfile=rankfile))
    assert local_rank() == device
    assert _device_map() == {"": device}


def test_a_rank_that_sees_only_its_own_gpu_takes_it(four_gpus):
    for name, value in SRUN.items():
        four_gpus.setenv(name, value)
    four_gpus.setattr(torch.cuda, "device_count", lambda: 1)  # CUDA_VISIBLE_DEVICES set per task
    assert _device_map() == {"": 0}


def test_without_cuda_the_base_stays_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert _device_map() == {"": "cpu"}


def test_load_quantized_passes_the_ranks_device(four_gpus):
    for name, value in SRUN.items():
        four_gpus.setenv(name, value)
    seen = {}

    def from_pretrained(name, **options):
        seen.update(options)
        raise RuntimeError("stop here")

    four_gpus.setattr(quantization.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(RuntimeError, match="stop here"):
        quantization.load_quantized("some/model", config=None, dtype=torch.float32)
    assert seen["device_map"] == {"": 2}
