"""The ``>>>`` examples in the docstrings of the package run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import lightning_grpo

SKIP = {"lightning_grpo.__main__", "lightning_grpo.cli", "lightning_grpo.demo"}  # entry points: tested by tests/cli
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(lightning_grpo.__path__, "lightning_grpo.") if info.name not in SKIP
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
