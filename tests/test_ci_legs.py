"""The CI legs' requirements (``.ci/leg.py``): the oldest leg pins exactly the floors ``pyproject.toml`` declares,
and docs/versions.md's table names the same floors. leg.py reads TOML on Python 3.10 too (pip's tomli), and README
names the Python that ``make test`` needs."""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent


def _load_leg() -> ModuleType:
    """``.ci/leg.py`` as a fresh module."""
    spec = importlib.util.spec_from_file_location("ci_leg", REPO / ".ci" / "leg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


leg = _load_leg()
PROJECT = leg.tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


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


def test_leg_reads_toml_without_tomllib_as_on_python_3_10(monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import tomllib fails, as on Python 3.10
    fallback = _load_leg()
    assert fallback.tomllib.__name__ == "pip._vendor.tomli"
    assert fallback.requirements("oldest") == leg.requirements("oldest", PROJECT)  # read from pyproject.toml


def test_leg_without_tomllib_or_pip_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "pip._vendor", None)
    with pytest.raises(
        SystemExit,
        match=r"with tomllib \(Python >= 3\.11\) or pip's vendored tomli, .* has neither: "
        r"run it with Python >= 3\.11, or install pip",
    ):
        _load_leg()


def _python_floor(specifier: str) -> Version:
    """The lowest Python a ``Requires-Python`` specifier admits (its largest ``>=`` bound)."""
    return max((Version(s.version) for s in SpecifierSet(specifier) if s.operator == ">="), default=Version("0"))


def test_readme_names_the_python_make_test_needs_and_the_package_needs():
    readme = (REPO / "README.md").read_text()
    make = re.search(r"`make demo` and `make test` do the whole set-up on a fresh machine \(Python >= ([\d.]+)", readme)
    package = re.search(r"the package itself installs on Python >= ([\d.]+)", readme)
    assert make and package, "README.md names the Python of `make test` and of the package"
    assert SpecifierSet(PROJECT["requires-python"]) == SpecifierSet(f">={package.group(1)}")
    versions = (REPO / "docs" / "versions.md").read_text()
    assert f"Python {make.group(1)} in all three" in versions  # CI runs the Python README names
    # The extras `make test` installs: on the Python CI runs, what pip chose needs exactly README's version at least
    extras = PROJECT["optional-dependencies"]
    floors = {}
    for requirement in map(Requirement, [*extras["dev"], *extras["vllm-cpu"]]):
        try:
            floors[requirement.name] = _python_floor(metadata.metadata(requirement.name)["Requires-Python"] or "")
        except metadata.PackageNotFoundError:
            continue
    if sys.version_info[:2] != Version(make.group(1)).release[:2] or "trl" not in floors:
        pytest.skip(f"the dev extra is checked on Python {make.group(1)} with it installed (make test)")
    assert max(floors.values()) == Version(make.group(1)), floors
