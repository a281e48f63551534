"""The package's import graph has no cycle: every module of ``lightning_grpo`` is read with ``ast`` (no import).

Edges are the imports a module names: ``import a.b``, ``from a import b`` (to ``a.b`` when ``b`` is a submodule,
else to ``a``), relative imports resolved, imports inside functions and ``if`` blocks included (``TYPE_CHECKING``
blocks too — ``lightning_grpo/__init__.py``, ``cli/__init__.py`` and ``cli/errors.py`` have them — so no cycle hides
in one). The parent packages that Python initialises on the way
to a module are not edges: ``lightning_grpo/__init__.py`` re-exports the public names and every module lies below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_grpo

PACKAGE = Path(lightning_grpo.__file__).resolve().parent
ROOT = "lightning_grpo"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its ``__init__.py``)."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module of a ``from ... import`` inside module ``name``."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(name: str, source: str, modules: set[str], is_package: bool = False) -> set[str]:
    """The modules of the package that the module ``name`` imports (its edges)."""
    edges = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            edges |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, name, is_package)
            submodules = {f"{target}.{alias.name}" for alias in node.names} & modules
            edges |= submodules or {target}
            if len(submodules) < len(node.names):  # some names are attributes of the target's __init__
                edges.add(target)
    return {edge for edge in edges if edge in modules and edge != name}


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    modules = set(files)
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), modules, path.name == "__init__.py")
        for name, path in files.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None`` (depth-first search, colouring the nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph(module_files())
    assert {"lightning_grpo.module", "lightning_grpo.iteration.update", "lightning_grpo.cli"} <= set(graph)
    assert "lightning_grpo.iteration.types" in graph["lightning_grpo.iteration.update"]  # the walk sees the edges
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


#: The layers, bottom up (README, "Layout"): a module imports its own layer and those below, never one above.
LAYERS = (
    (
        "lightning_grpo.settings_checks",
        "lightning_grpo.extras",
        "lightning_grpo.algorithms",
        "lightning_grpo.distributed",
    ),
    ("lightning_grpo.metrics", "lightning_grpo.rewards", "lightning_grpo.agents"),
    ("lightning_grpo.rollout", "lightning_grpo.policy"),
    (
        "lightning_grpo.data",
        "lightning_grpo.config",
        "lightning_grpo.checkpoint",
        "lightning_grpo.backends",
        "lightning_grpo.rank_failures",
    ),
    ("lightning_grpo.iteration",),
    ("lightning_grpo.callbacks",),
    ("lightning_grpo.module",),
    ("lightning_grpo.cli",),
    ("lightning_grpo.testing",),
    ("lightning_grpo.demo",),
    ("lightning_grpo.__main__", "lightning_grpo"),
)


def layer(name: str) -> int:
    """The layer of a module: that of the longest name in :data:`LAYERS` that is the module or a package above it."""
    found = [
        (len(top), i) for i, names in enumerate(LAYERS) for top in names if name == top or name.startswith(top + ".")
    ]
    return max(found)[1]


def test_imports_point_down_the_layers():
    graph = import_graph(module_files())
    upward = sorted(f"{a} -> {b}" for a, edges in graph.items() for b in edges if layer(b) > layer(a))
    assert (layer("lightning_grpo.iteration.update"), layer("lightning_grpo")) == (4, len(LAYERS) - 1)
    assert upward == [], "imports that run up the layers:\n" + "\n".join(upward)


def test_the_walk_finds_relative_submodule_and_function_level_imports():
    modules = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d"}
    source = "from . import b\nfrom .sub import d\ndef f():\n    from p.c import thing\nimport p.sub\n"
    assert imports_of("p.a", source, modules) == {"p.b", "p.sub.d", "p.c", "p.sub"}
    assert imports_of("p.sub", "from .. import a\nfrom . import d\n", modules, is_package=True) == {"p.a", "p.sub.d"}
    assert imports_of("p.sub.d", "from ..a import x\n", modules) == {"p.a"}


def test_a_cycle_is_found_and_named():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    modules = {"p.a", "p.b"}
    graph = {"p.a": imports_of("p.a", "from p.b import x", modules), "p.b": imports_of("p.b", "import p.a", modules)}
    assert find_cycle(graph) == ["p.a", "p.b", "p.a"]
