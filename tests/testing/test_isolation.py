"""Production modules never import ``lightning_grpo.testing``: the fixtures stay out of the production path."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import lightning_grpo

PACKAGE = Path(lightning_grpo.__file__).resolve().parent
FIXTURES = "lightning_grpo.testing"

_IMPORT_ALL = """
import importlib, json, sys
names = json.loads(sys.argv[1])
for name in names:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("lightning_grpo.testing"))))
"""


def _production_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if (PACKAGE / "testing") not in p.parents)


def _fixture_imports(tree: ast.AST) -> list[tuple[int, str | None]]:
    """``(line, enclosing function or None)`` of every import of the fixtures in a module's syntax tree."""
    found, parents = [], {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        if any(name == FIXTURES or name.startswith(f"{FIXTURES}.") for name in names):
            scope = node
            while scope in parents and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                scope = parents[scope]
            found.append((node.lineno, getattr(scope, "name", None)))
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_importing_every_production_module_loads_no_fixture():
    names = [_module_name(path) for path in _production_files()]
    assert {"lightning_grpo.module", "lightning_grpo.cli", "lightning_grpo.policy", "lightning_grpo.data"} <= set(names)
    command = [sys.executable, "-c", _IMPORT_ALL, json.dumps(names)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)  # a fresh interpreter
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_no_production_module_imports_the_fixtures_not_even_the_demo_command():
    offenders = {}
    for path in _production_files():  # the demo (lightning_grpo/demo/) names the fixtures in its YAML config only
        for line, function in _fixture_imports(ast.parse(path.read_text(encoding="utf-8"))):
            offenders[f"{path.relative_to(PACKAGE)}:{line}"] = function
    assert offenders == {}


def test_the_scan_finds_an_import_of_the_fixtures():
    source = "import os\nfrom lightning_grpo.testing import TinyModel\ndef f():\n    import lightning_grpo.testing\n"
    tree = ast.parse(source)
    assert _fixture_imports(tree) == [(2, None), (4, "f")]


#: Libraries the pure-torch math in ``lightning_grpo.algorithms`` must not import (the HF glue lives in rollout/).
HF_LIBRARIES = ("transformers", "peft", "datasets", "accelerate", "bitsandbytes")


def _imported_roots(tree: ast.AST) -> set[str]:
    """The top-level package of every import in a module's syntax tree (relative imports excluded)."""
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_algorithms_import_no_hugging_face_library():
    files = sorted((PACKAGE / "algorithms").glob("*.py"))
    assert {"fused_head.py", "logprob_kernels.py", "advantages.py"} <= {p.name for p in files}
    offenders = {
        p.name: sorted(_imported_roots(ast.parse(p.read_text(encoding="utf-8"))) & set(HF_LIBRARIES)) for p in files
    }
    assert {name: libs for name, libs in offenders.items() if libs} == {}


def test_the_import_scan_finds_a_hugging_face_import():
    tree = ast.parse("import torch\nfrom transformers.cache_utils import DynamicCache\ndef f():\n    import peft\n")
    assert _imported_roots(tree) & set(HF_LIBRARIES) == {"transformers", "peft"}
