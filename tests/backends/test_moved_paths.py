"""The backend modules' old import paths still import, each with one ``DeprecationWarning`` that names the new path."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from lightning_grpo import backends
from lightning_grpo.backends import vllm_engine, vllm_files, vllm_settings, vllm_start
from lightning_grpo.callbacks.close_rollout_backend import CloseRolloutBackend

_OLD, _NEW = "lightning_grpo.rollout", "lightning_grpo.backends"
MOVES = [
    (f"{_OLD}.vllm_settings", "VLLMConfig", vllm_settings.VLLMConfig, f"{_NEW}.vllm_settings"),
    (f"{_OLD}.vllm_files", "make_work_dir", vllm_files.make_work_dir, f"{_NEW}.vllm_files"),
    (f"{_OLD}.vllm_start", "build_llm", vllm_start.build_llm, f"{_NEW}.vllm_start"),
    (f"{_OLD}.vllm_engine", "VLLMEngine", vllm_engine.VLLMEngine, f"{_NEW}.vllm_engine"),
    ("lightning_grpo.step.rollout_engine", "VLLMRollout", backends.VLLMBackend, "lightning_grpo.backends.vllm"),
    ("lightning_grpo.callbacks.rollout_engine", "CloseRolloutEngine", CloseRolloutBackend,
     "lightning_grpo.callbacks.close_rollout_backend"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "name", "new", "path"), MOVES, ids=[move[0] for move in MOVES])
def test_an_old_path_gives_the_new_object_and_warns_once_naming_the_new_path(old, name, new, path):
    module = importlib.reload(importlib.import_module(old))  # a fresh module: its one warning not given yet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert getattr(module, name) is new
        assert getattr(module, name) is new
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old}{'.' + name if old.startswith('lightning_grpo.callbacks') else ''} moved to {path}"
        + (f".{new.__name__}" if old.startswith("lightning_grpo.callbacks") else f"; import {new.__name__} from there")
    ]
    with pytest.raises(AttributeError):
        module.__no_such_name__  # noqa: B018


def test_the_package_itself_imports_no_moved_path():
    code = (
        "import warnings\nwarnings.simplefilter('always')\nwith warnings.catch_warnings(record=True) as caught:\n"
        "    import lightning_grpo, lightning_grpo.cli, lightning_grpo.backends\n"
        "print([str(w.message) for w in caught if 'moved to' in str(w.message)])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
