"""A file name appears in two folders of ``lightning_grpo`` only where docs/index.md says so, one feature per layer.

The documented names are the bare file names (``name.py``, in backticks) of the "File names in two folders" section
of docs/index.md; a new module that repeats a name elsewhere in the package fails here until it is renamed or
documented there. Python's own module names (``__init__.py``, ``__main__.py``) are left out on both sides.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import lightning_grpo

PACKAGE = Path(lightning_grpo.__file__).resolve().parent
INDEX = Path(__file__).resolve().parents[1] / "docs" / "index.md"
SECTION = "### File names in two folders"


def repeated_file_names(package: Path = PACKAGE) -> dict[str, list[str]]:
    """File name -> the folders (relative to ``package``) holding it, for every name found in two or more."""
    folders: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        if not (path.name.startswith("__") and path.name.endswith("__.py")):
            folders[path.name].append(path.parent.relative_to(package).as_posix())
    return {name: where for name, where in folders.items() if len(where) > 1}


def documented_file_names(text: str) -> set[str]:
    """The bare file names (``name.py`` in backticks, no folder) of the section under :data:`SECTION` in ``text``."""
    (section,) = re.findall(rf"^{re.escape(SECTION)}\n(.*?)(?=^#|\Z)", text, flags=re.MULTILINE | re.DOTALL)
    return {name for name in re.findall(r"`(\w+\.py)`", section) if not name.startswith("__")}


def test_every_file_name_in_two_folders_is_documented_and_nothing_else():
    repeated = repeated_file_names()
    documented = documented_file_names(INDEX.read_text(encoding="utf-8"))
    undocumented = {name: where for name, where in repeated.items() if name not in documented}
    assert not undocumented, f"file names in two folders, not in docs/index.md ({SECTION!r}): {undocumented}"
    assert documented <= set(repeated), f"documented but no longer repeated: {sorted(documented - set(repeated))}"


def test_the_walk_finds_repeats_and_the_section_reader_ignores_paths(tmp_path):
    for relative in ("a/x.py", "b/x.py", "b/y.py", "a/__init__.py", "b/__init__.py", "c/__main__.py", "__main__.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).touch()
    assert repeated_file_names(tmp_path) == {"x.py": ["a", "b"]}
    text = f"## Layout\n\n{SECTION}\n\n- `x.py`: `a/x.py` and `b/` (`__init__.py` aside)\n\n## Next\n\n`z.py`\n"
    assert documented_file_names(text) == {"x.py"}
