"""A full disk during a checkpoint: the error names the file and the previous checkpoint, which
stays intact and resumable."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_grpo.checkpoint import CheckpointWriteError
from tests.cli.run_process import REPO
from tests.conftest import make_trainer, prompt_loader


def test_a_failed_write_names_the_file_and_keeps_the_previous_checkpoint(make_module, tmp_path, monkeypatch):
    real, calls = TorchCheckpointIO.save_checkpoint, []

    def fills_the_disk(self, checkpoint, path, storage_options=None):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint: half written, then the disk is full
            path.write_bytes(b"PK\x03\x04 half a zip")
            raise OSError(27, "File too large")
        real(self, checkpoint, path, storage_options)

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", fills_the_disk)
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_last=True, save_top_k=0)
    trainer = make_trainer(max_steps=3, enable_checkpointing=True, callbacks=[checkpoints])
    with pytest.raises(CheckpointWriteError) as failure:
        trainer.fit(make_module(), train_dataloaders=prompt_loader(["1+1=", "2+2="], repeat=3))
    message = str(failure.value)
    assert f"could not write checkpoint {tmp_path / 'last.ckpt'}: File too large (errno 27)" in message
    assert f"{tmp_path / 'last.ckpt'} still holds the previous checkpoint, intact: resume from it" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no partial file left behind
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 1  # the previous one, intact


SCRIPT = """
import pathlib, resource, signal, sys
from lightning_grpo.checkpoint import CheckedCheckpointIO
from lightning.pytorch.plugins.io import TorchCheckpointIO
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
folder = pathlib.Path(sys.argv[1])
(folder / "earlier.ckpt").write_bytes(b"x")
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
CheckedCheckpointIO(TorchCheckpointIO()).save_checkpoint({"w": list(range(10000))}, folder / "step=2.ckpt")
"""


def test_a_real_file_size_limit(tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lightning_grpo.checkpoint.records.CheckpointWriteError: [Errno 27] could not write")
    assert f"the previous checkpoint {tmp_path / 'earlier.ckpt'} is intact" in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.ckpt"]
