"""docs/backends.md's example backend runs as written: chosen by import path, it samples a fit's rollouts."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from lightning_grpo.config import BackendConfig
from tests.conftest import make_trainer, prompt_loader, tiny_sampling

PAGE = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def test_the_pages_backend_trains_from_its_import_path(make_module, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    (block,) = [b for b in blocks if b.startswith("# my_project/backends.py")]
    (tmp_path / "my_project").mkdir()
    (tmp_path / "my_project" / "__init__.py").write_text("")
    (tmp_path / "my_project" / "backends.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_project", raising=False)
    module = make_module(
        backend=BackendConfig(
            rollout_backend="my_project.backends.CountingBackend", rollout_backend_args={"log_every": 5}
        )
    )
    assert module.rollout_backend.settings.log_every == 5
    make_trainer(max_steps=2).fit(module, prompt_loader(["1+1=", "2+2="]))
    assert module.rollout_backend.rollouts == 2
    with pytest.raises(
        ValueError, match=r"^GRPOConfig\.sampling\.static_cache=True: the rollout backend .* does not honour"
    ):
        make_module(
            backend=BackendConfig(rollout_backend="my_project.backends.CountingBackend"),
            sampling=tiny_sampling(static_cache=True),
        )
