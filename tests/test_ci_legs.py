"""The CI legs' requirements (``.ci/leg.py``): the oldest leg pins exactly the floors ``pyproject.toml`` declares,
and docs/versions.md's table names the same floors."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11, as .ci/leg.py")

REPO = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("ci_leg", REPO / ".ci" / "leg.py")
leg = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(leg)

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def floors() -> dict[str, str]:
    """Distribution name -> the ``>=`` floor of every core dependency in pyproject.toml."""
    found = {}
    for requirement in PROJECT["dependencies"]:
        match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([^,;\s]+)", requirement)
        if match and match.group(1).lower() in leg.CORE:
            found[match.group(1).lower()] = match.group(2)
    return found


def test_the_oldest_leg_pins_every_core_floor_exactly_and_leaves_out_trl_mcp_and_vllm():
    reqs = leg.requirements("oldest", PROJECT)
    pinned = {leg._name(r): r.split("==")[1] for r in reqs if "==" in r}
    assert pinned == floors()
    assert set(pinned) == set(leg.CORE)
    assert "jsonargparse[signatures]==" + floors()["jsonargparse"] in reqs  # the extra is kept
    assert not [r for r in reqs if leg._name(r).startswith(("trl", "mcp", "vllm"))]
    assert {"pytest", "pytest-xdist", "hypothesis"} <= {leg._name(r) for r in reqs}


def test_the_newest_leg_takes_the_ranges_and_the_whole_dev_extra():
    reqs = leg.requirements("newest", PROJECT)
    assert reqs == [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["dev"]]
    assert not [r for r in reqs if "==" in r]


def test_a_core_dependency_without_a_floor_and_an_unknown_leg_are_refused():
    project = {**PROJECT, "dependencies": ["torch", *PROJECT["dependencies"][1:]]}
    with pytest.raises(ValueError, match=r"'torch' declares no lower bound"):
        leg.requirements("oldest", project)
    with pytest.raises(ValueError, match=r"unknown leg 'middle': expected one of oldest, newest"):
        leg.requirements("middle", PROJECT)


def test_the_venv_lives_outside_the_clone_and_its_name_follows_the_pins(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_VENVS", str(tmp_path))
    first = leg.venv_dir("oldest", ["torch==2.11.0", "transformers==5.17.0"])
    assert first.parent == tmp_path and first.name.startswith("oldest-")
    assert leg.venv_dir("oldest", ["torch==2.11.0", "transformers==5.17.0"]) == first
    assert leg.venv_dir("oldest", ["torch==2.11.0", "transformers==5.18.0"]) != first


def test_docs_versions_table_names_the_floors():
    lines = (REPO / "docs" / "versions.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `oldest`"))
    cells = [c.strip() for c in row.split("|")[2:8]]
    order = ("torch", "transformers", "peft", "lightning", "torchmetrics", "jsonargparse")
    for name, cell in zip(order, cells, strict=True):
        floor = floors()[name]
        assert cell == floor or cell == f"{floor}.0", (name, cell, floor)
