"""The ``>>>`` examples in the docstrings of the package run and print what they claim: the one runner for all."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import lightning_grpo

#: Entry points, tested by running them (tests/cli, tests/demo/test_demo.py).
SKIP = {"lightning_grpo.__main__", "lightning_grpo.cli", "lightning_grpo.demo"}
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(lightning_grpo.__path__, "lightning_grpo.") if info.name not in SKIP
)
#: Modules whose docstrings must hold examples, so that losing them all fails here rather than passing quietly.
WITH_EXAMPLES = {
    *(f"lightning_grpo.rewards.{name}" for name in ("reward_functions", "format", "math_answer", "overlong")),
    *(
        f"lightning_grpo.callbacks.{name}"
        for name in ("adapter_export", "completion_stats", "defaults", "group_rewards", "progress_bar")
    ),
    "lightning_grpo.callbacks.sample_logger",
    "lightning_grpo.callbacks.throughput",
    "lightning_grpo.settings_checks",
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files (or build a Trainer) write them here
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=flags)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
    if name in WITH_EXAMPLES:
        assert result.attempted > 0, f"{name} lost its docstring examples"


def test_every_module_that_must_have_examples_exists():
    assert set(MODULES) >= WITH_EXAMPLES
