"""The documentation site: it builds strictly, and its reference pages keep up with the code.

* ``mkdocs build --strict`` succeeds (broken links, unknown anchors, missing nav pages, docstrings griffe cannot
  read and mkdocstrings failures are all errors), into a temporary directory, without network: mkdocstrings reads
  the sources statically and MathJax is only referenced, never fetched.
* Every field of ``GRPOConfig``'s groups has a row in its group's section of ``docs/configuration.md``, every field
  of ``PolicyConfig`` and ``VLLMConfig`` a row there.
* Every name of the four algorithm catalogues appears in ``docs/math.md``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_grpo.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
from lightning_grpo.backends.vllm.settings import VLLMConfig
from lightning_grpo.config import GROUPS
from lightning_grpo.policy import PolicyConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _table_names(page: Path) -> set[str]:
    """Names in the first column of the page's Markdown tables: ``| `name` | ...``."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", page.read_text(encoding="utf-8"), flags=re.MULTILINE))


def _code_spans(page: Path) -> set[str]:
    """Every ``code span`` of the page."""
    return set(re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8")))


def test_docs_build_strict(tmp_path: Path) -> None:
    for plugin in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(plugin, reason='the docs tools come with pip install -e ".[dev]"')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    result = subprocess.run(
        # Not --quiet: it raises the log level above WARNING, so mkdocs 1.6 no longer counts warnings for --strict.
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert "Aborted" not in result.stderr and "WARNING" not in result.stderr, result.stderr
    for page in ("index.html", "math/index.html", "configuration/index.html", "api/module/index.html"):
        assert (site / page).is_file(), f"{page} was not built"
    # mkdocstrings rendered the API (a failed directive would have failed the strict build, but check one object).
    assert 'id="lightning_grpo.module.GRPOModule"' in (site / "api/module/index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("config", [PolicyConfig, VLLMConfig], ids=lambda c: c.__name__)
def test_every_config_field_is_documented(config: type) -> None:
    documented = _table_names(DOCS / "configuration.md")
    missing = [field.name for field in dataclasses.fields(config) if field.name not in documented]
    assert not missing, f"docs/configuration.md has no table row for {config.__name__} field(s) {missing}"


@pytest.mark.parametrize(("group", "config"), list(GROUPS.items()), ids=list(GROUPS))
def test_every_grpo_setting_is_documented_in_its_group(group: str, config: type) -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    heading = re.search(rf"^### .*`grpo\.{group}`.*$", text, flags=re.MULTILINE)
    assert heading, f"docs/configuration.md has no section headed `grpo.{group}`"
    section = text[heading.end() :].split("\n#", 1)[0]
    documented = set(re.findall(r"^\|\s*`([^`]+)`\s*\|", section, flags=re.MULTILINE))
    missing = [field.name for field in dataclasses.fields(config) if field.name not in documented]
    assert not missing, f"the `grpo.{group}` section of docs/configuration.md has no row for {missing}"


@pytest.mark.parametrize(
    ("catalogue", "names"),
    [
        ("ADVANTAGE_ESTIMATORS", ADVANTAGE_ESTIMATORS),
        ("POLICY_LOSSES", POLICY_LOSSES),
        ("KL_ESTIMATORS", KL_ESTIMATORS),
        ("LOSS_AGG_MODES", LOSS_AGG_MODES),
    ],
)
def test_every_catalogue_name_is_in_the_math_page(catalogue: str, names: object) -> None:
    spans = _code_spans(DOCS / "math.md")
    missing = [name for name in names if name not in spans]
    assert not missing, f"docs/math.md does not mention {catalogue} name(s) {missing} (as `code`)"


def test_nav_pages_exist() -> None:
    nav = re.findall(r":\s*([\w./-]+\.md)\s*$|^\s*-\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = [a or b for a, b in nav]
    assert "distributed.md" in pages and "benchmarks.md" in pages
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml lists pages that do not exist: {missing}"
