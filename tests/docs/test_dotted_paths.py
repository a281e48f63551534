"""Every dotted ``lightning_grpo...`` path that the docs, the examples, the configs and the README name imports.

A path names a module (``importlib.import_module``) or a name inside one (the longest importable prefix, then
``getattr`` for the rest: ``lightning_grpo.rollout.agent_client.AgentLimits``, ``lightning_grpo.GRPOModule.generate``).
The package keeps no old import paths, so a path left behind by a move fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Where users read or copy paths from.
SOURCES = ("docs", "examples", "configs", "README.md")
SUFFIXES = {".md", ".py", ".yaml", ".yml"}
DOTTED = re.compile(r"\blightning_grpo(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _files() -> list[Path]:
    files = []
    for source in SOURCES:
        path = ROOT / source
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
    return files


def named_paths() -> dict[str, str]:
    """Each dotted path -> the first file (relative to the repository) that names it."""
    found: dict[str, str] = {}
    for file in _files():
        for path in DOTTED.findall(file.read_text(encoding="utf-8")):
            found.setdefault(path, str(file.relative_to(ROOT)))
    return found


def resolve(path: str) -> object:
    """The module or object ``path`` names; raises ``ImportError`` or ``AttributeError`` when it names none."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as error:
            if error.name is None or not path.startswith(error.name):  # a missing dependency, not a missing module
                raise
            continue
        for name in parts[end:]:
            target = getattr(target, name)
        return target
    raise ImportError(f"no module of {path!r} imports")


PATHS = named_paths()


def test_the_sources_name_paths():
    assert len(PATHS) > 50  # the scan reads the files (a broken pattern would find none and pass)
    assert "lightning_grpo.GRPOModule" in PATHS


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_named_path_imports(path):
    try:
        resolve(path)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{PATHS[path]} names {path}, which does not import: {error}")


def test_a_path_that_moved_fails():
    with pytest.raises((ImportError, AttributeError)):
        resolve("lightning_grpo.step.update")
    with pytest.raises(AttributeError):
        resolve("lightning_grpo.rollout.agent.Trajectory")
