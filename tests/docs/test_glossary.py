"""docs/glossary.md defines each word the package names things by, and the package uses no retired name.

One word, one meaning: "step" is an optimizer step (what ``global_step`` counts), "run" a whole fit. The names that
used them for a GRPO iteration or one agent execution were renamed; this keeps them from coming back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "glossary.md"
PACKAGE = ROOT / "lightning_grpo"

#: Each must be a term of the glossary (a definition-list entry: the term on its own line, then ``:   ``).
TERMS = (
    "iteration", "optimizer step", "rollout", "trajectory", "turn", "run", "row", "group", "step reward",
    "environment step", "mini-batch", "micro-batch", "behaviour log-probs",
)  # fmt: skip

#: Retired name -> what replaced it. Matched as a whole identifier: ``log_every_n_steps`` (Lightning's) is not
#: ``every_n_steps``, ``iteration_seed`` is not ``step_seed``.
RETIRED = {
    "StepContext": "IterationContext",
    "step_context": "iteration_context",
    "step_seed": "iteration_seed",
    "_step_seed": "_iteration_seed",
    "every_n_steps": "every_n_iterations",
    "sample_every_n_steps": "sample_every_n_iterations",
    "BackendRun": "BackendSpec",
    "AgentRun": "AgentExecution",
}

#: The only places a retired name may stay, with how often and why.
ALLOWED = {
    # the old argument, to read the callback states of checkpoints saved before the rename (upgrade_state_keys)
    ("callbacks/iteration_counter.py", "every_n_steps"): 2,
}


def glossary_terms(text: str) -> list[str]:
    """The terms of a Markdown definition list: a line followed by a line that starts with ``:   ``."""
    return re.findall(r"^([^\s:#][^\n]*)\n:   ", text, flags=re.MULTILINE)


def test_the_glossary_defines_every_term():
    terms = glossary_terms(GLOSSARY.read_text(encoding="utf-8"))
    assert len(terms) >= len(TERMS)  # the pattern reads the page (a broken one would find nothing)
    missing = [term for term in TERMS if term not in terms]
    assert not missing, f"docs/glossary.md has no entry for {missing}"


def test_the_glossary_is_in_the_site_navigation():
    assert re.search(r"^\s*- Glossary: glossary\.md\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.MULTILINE)


def retired_names_in(path: Path) -> dict[str, int]:
    """How often each retired name occurs in ``path`` as a whole identifier."""
    text = path.read_text(encoding="utf-8")
    found = {name: len(re.findall(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", text)) for name in RETIRED}
    return {name: count for name, count in found.items() if count}


@pytest.mark.parametrize("name", sorted(RETIRED))
def test_the_pattern_finds_a_retired_name(tmp_path, name):
    sample = tmp_path / "sample.py"
    sample.write_text(f"x = {name}(1)  # log_every_n_steps and iteration_seed are not it\n", encoding="utf-8")
    assert retired_names_in(sample) == {name: 1}


def test_the_package_uses_no_retired_name():
    files = sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.yaml"))
    assert len(files) > 100  # the scan reads the package
    left = {}
    for path in files:
        relative = path.relative_to(PACKAGE).as_posix()
        for name, count in retired_names_in(path).items():
            if ALLOWED.get((relative, name)) != count:
                left[f"{relative}: {name}"] = f"{count}x, now {RETIRED[name]}"
    assert not left, f"retired names (docs/glossary.md) left in lightning_grpo/: {left}"
