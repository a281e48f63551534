"""The vLLM engine's work folder: room for the adapter (and base) checked before anything is written (docs/vllm.md).

Free space is faked with a patched ``shutil.disk_usage``; ``/dev/shm`` and the temporary folder are folders of the
test, so nothing depends on the machine's own.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest

from lightning_grpo import PolicyConfig
from lightning_grpo.backends.vllm import files as vllm_files
from lightning_grpo.backends.vllm.files import bytes_needed, make_work_dir
from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.policy import load_policy
from tests.backends.vllm_helpers import needs_vllm, tiny_policy, vllm_module

_Usage = namedtuple("_Usage", "total used free")


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """``shm`` and ``tmp`` folders standing in for ``/dev/shm`` and the system's temporary folder, and ``free``, a
    dict of the bytes free per folder (unlisted folders: plenty)."""
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir(), tmp.mkdir()
    monkeypatch.setattr(vllm_files, "_SHM", str(shm))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    free: dict[Path, int] = {}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _Usage(2**40, 0, free.get(Path(path), 2**39)))
    return shm, tmp, free


def test_the_bytes_needed_are_the_adapters_and_the_bases_with_a_margin():
    policy = load_policy(tiny_policy(), PolicyConfig(lora_r=4, lora_alpha=8))
    adapter = sum(p.numel() * 4 for p in policy.parameters() if p.requires_grad)  # float32 LoRA A and B
    base = sum(p.numel() * 4 for n, p in policy.named_parameters(remove_duplicate=False) if "lora_" not in n)
    assert bytes_needed(policy, adapter=True, base=False) == int(adapter * 1.25) + 2**20
    assert bytes_needed(policy, adapter=True, base=True) == int((adapter + base) * 1.25) + 2**20
    assert bytes_needed(policy, adapter=False, base=False) == 2**20  # merged sync, engine from the hub: no files


def test_a_roomy_dev_shm_is_the_default(folders):
    shm, _, free = folders
    free[shm] = 10_000
    assert make_work_dir(VLLMConfig(), needed=10_000).parent == shm


def test_a_small_dev_shm_gives_way_to_the_temporary_folder_with_a_warning(folders, caplog):
    shm, tmp, free = folders
    free[shm] = 64 * 2**20  # Docker's default
    with caplog.at_level(logging.WARNING, logger=vllm_files.__name__):
        folder = make_work_dir(VLLMConfig(), needed=74 * 2**20)  # a Qwen2.5-1.5B r=16 float32 adapter
    assert folder.parent == tmp and list(shm.iterdir()) == []
    (record,) = caplog.records
    assert "64.0 MiB free, less than the 74.0 MiB" in record.getMessage() and "vllm.work_dir" in record.getMessage()


def test_a_work_dir_the_user_set_that_is_too_small_is_an_error_naming_it(folders, tmp_path):
    chosen = tmp_path / "mine"
    folders[2][chosen] = 1_000
    with pytest.raises(OSError, match=r"vllm\.work_dir = '.*mine' has 1,000 bytes free .* need 5,000 bytes"):
        make_work_dir(VLLMConfig(work_dir=str(chosen)), needed=5_000)
    assert list(chosen.iterdir()) == []  # nothing written
    assert make_work_dir(VLLMConfig(work_dir=str(chosen)), needed=900).parent == chosen


def test_when_neither_default_has_room_the_error_says_to_set_work_dir(folders):
    shm, tmp, free = folders
    free[shm] = free[tmp] = 1_000
    with pytest.raises(OSError, match=r"temporary folder .*1,000 bytes free.*set vllm\.work_dir"):
        make_work_dir(VLLMConfig(), needed=5_000)


@needs_vllm
def test_the_engine_checks_the_room_before_writing_the_base(folders, tmp_path):
    chosen = tmp_path / "small"
    folders[2][chosen] = 2**20
    module = vllm_module(vllm=VLLMConfig(work_dir=str(chosen)))
    with pytest.raises(OSError, match=r"vllm\.work_dir = .* need [\d,]+ bytes"):
        module.rollout_backend.start(module.policy, seed=0, sharded=False)
    assert list(chosen.iterdir()) == []
