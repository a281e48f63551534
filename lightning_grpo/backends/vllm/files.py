"""The files the vLLM engine loads: the policy's base (written once) and the adapter of each sync, in a work folder.

The folder is ``vllm.work_dir``, by default ``/dev/shm`` (memory, so a sync never waits on a disk). Containers often
give ``/dev/shm`` little room (Docker's default is 64 MB, less than a Qwen2.5-1.5B adapter of rank 16 on every linear
layer in float32, about 74 MB), so the free space is checked against what will be written before anything is:
a default ``/dev/shm`` that is too small gives way to the system's temporary folder with a warning; a folder the user
chose that is too small is an error naming ``vllm.work_dir`` (docs/vllm.md).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
from peft import PeftModel

from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.policy.weights import base_weights

__all__ = ["bytes_needed", "make_work_dir", "save_base"]

_log = logging.getLogger(__name__)
_SHM = "/dev/shm"
#: Room asked beyond the tensors' bytes: file headers, ``adapter_config.json`` / ``config.json``, and a margin.
_MARGIN, _SLACK = 1.25, 1 << 20


def bytes_needed(policy: PeftModel, *, adapter: bool, base: bool) -> int:
    """Bytes the work folder must have free: the adapter's (``adapter``) and the base model's (``base``), with margin.

    The adapter's size is that of the trainable parameters (in their own dtype, as they are saved); each sync
    overwrites the one before. The base's is every non-adapter weight, a tied output head counted twice (it is
    written under both names).
    """
    size = 0
    if adapter:
        size += _size(p for p in policy.parameters() if p.requires_grad)
    if base:
        size += _size(p for name, p in policy.named_parameters(remove_duplicate=False) if "lora_" not in name)
    return int(size * _MARGIN) + _SLACK


def _size(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)  # a sharded (DTensor) weight counts its full size


def make_work_dir(config: VLLMConfig, needed: int) -> Path:
    """A new folder for the engine's files, in ``config.work_dir`` or the default, with ``needed`` bytes free.

    Raises:
        OSError: ``config.work_dir`` (or, when it is unset, the temporary folder) has less than ``needed`` bytes free.
    """
    if config.work_dir is not None:
        root = Path(config.work_dir)
        root.mkdir(parents=True, exist_ok=True)
        _check_room(root, needed, setting="vllm.work_dir")
        return Path(tempfile.mkdtemp(prefix="lightning-grpo-vllm-", dir=root))
    root = None
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK):
        free = shutil.disk_usage(_SHM).free
        if free >= needed:
            root = _SHM
        else:
            _log.warning(
                "vLLM work folder: %s has %s free, less than the %s the engine's files need; using the temporary "
                "folder %s instead (set vllm.work_dir to choose another, or enlarge /dev/shm, e.g. docker run "
                "--shm-size=1g)",
                _SHM,
                _human(free),
                _human(needed),
                tempfile.gettempdir(),
            )
    if root is None:
        _check_room(Path(tempfile.gettempdir()), needed, setting="the temporary folder (vllm.work_dir unset)")
    return Path(tempfile.mkdtemp(prefix="lightning-grpo-vllm-", dir=root))


def _check_room(root: Path, needed: int, *, setting: str) -> None:
    free = shutil.disk_usage(root).free
    if free < needed:
        raise OSError(
            f"{setting} = {str(root)!r} has {free:,} bytes free ({_human(free)}), but the vLLM engine's files (the "
            f"adapter of each sync, and the base model when it is written there) need {needed:,} bytes "
            f"({_human(needed)}): set vllm.work_dir to a folder with that much room"
        )


def _human(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def save_base(policy: PeftModel, path: Path) -> Path:
    """Write the policy's base (adapter off) in Hugging Face format once, for the engine to load.

    Written here rather than by ``save_pretrained``, which writes on rank 0 only under ``torch.distributed`` (each
    rank's engine needs its own copy). A subclass of a library model (the tiny test model) is saved as the library's
    class, the one the engine knows.
    """
    from safetensors.torch import save_file

    base = policy.get_base_model()
    path.mkdir(parents=True, exist_ok=True)
    state, seen = {}, set()
    for name, weight in base_weights(policy):
        weight = weight.detach().contiguous()
        state[name] = weight.clone() if weight.data_ptr() in seen else weight  # tied weights: one file entry each
        seen.add(weight.data_ptr())
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(base.config)
    config.architectures = [next(c for c in type(base).__mro__ if c.__module__.startswith("transformers.")).__name__]
    config.to_json_file(str(path / "config.json"))
    return path
