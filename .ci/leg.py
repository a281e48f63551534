"""Build (once per machine) the virtual environment of one test leg, outside the clone, and print its path.

Two legs beside CI's main environment (docs/versions.md):

* ``oldest``: exactly the lower bounds that ``pyproject.toml`` declares for torch, transformers, peft, lightning,
  torchmetrics and jsonargparse (``>=X`` becomes ``==X``), and the test tools; no trl, mcp or vLLM, so the tests that
  need them skip.
* ``newest``: the newest torch pip resolves on this machine (a machine-wide pip constraint may cap it), transformers,
  peft and lightning, with the whole ``dev`` extra.

A leg's venv lives in ``${LIGHTNING_GRPO_VENVS:-~/.cache/lightning-grpo/venvs}/<leg>-<hash>``, the hash taken over the
versions pip resolves for it (a dry run, no wheel downloaded), so a fresh clone reuses it while they match and builds
a new one when a release changes them; the leg's older venvs are removed then (each holds a torch of several GB). The
package itself is not installed: the tests run from the clone (``PYTHONPATH``), so one venv serves every clone.

Usage: ``python3 .ci/leg.py oldest|newest`` (prints the venv's directory; build logs go to stderr).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors tomli, the same parser (leg.py drives pip anyway)
    try:
        from pip._vendor import tomli as tomllib
    except ModuleNotFoundError:
        raise SystemExit(
            "python3 .ci/leg.py reads pyproject.toml with tomllib (Python >= 3.11) or pip's vendored tomli, and this "
            f"Python ({sys.version.split()[0]}) has neither: run it with Python >= 3.11, or install pip"
        ) from None

REPO = Path(__file__).resolve().parent.parent
CORE = ("torch", "transformers", "peft", "lightning", "torchmetrics", "jsonargparse")
TOOLS = ("pytest", "pytest-timeout", "pytest-xdist", "hypothesis")
# Left out of the oldest leg: trl, mcp and vLLM (their tests skip), the docs and lint tools, and bitsandbytes (its
# tests need CUDA). setuptools is never needed: the package is not installed into a leg's venv.
OLDEST_EXCLUDES = ("trl", "mcp", "vllm", "mkdocs", "ruff", "bitsandbytes")
LEGS = ("oldest", "newest")


def _name(requirement: str) -> str:
    """The distribution name of a requirement string, lower case (``jsonargparse[signatures]>=4`` -> jsonargparse)."""
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def _floor(requirement: str) -> str:
    """``name[extras]>=X,<Y`` -> ``name[extras]==X``.

    Raises:
        ValueError: The requirement declares no ``>=`` lower bound.
    """
    match = re.match(r"^([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?)\s*>=\s*([^,;\s]+)", requirement)
    if match is None:
        raise ValueError(f"{requirement!r} declares no lower bound (>=X): the oldest leg pins every core floor")
    return f"{match.group(1)}=={match.group(2)}"


def requirements(leg: str, project: dict | None = None) -> list[str]:
    """The requirement strings pip installs into ``leg``'s venv.

    Args:
        leg: ``"oldest"`` or ``"newest"``.
        project: The ``[project]`` table of ``pyproject.toml`` (read from the clone when ``None``).

    Raises:
        ValueError: An unknown leg, or a core dependency without a ``>=`` floor.
    """
    if leg not in LEGS:
        raise ValueError(f"unknown leg {leg!r}: expected one of {', '.join(LEGS)}")
    if project is None:
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dependencies = list(project["dependencies"])
    dev = list(project["optional-dependencies"]["dev"])
    if leg == "newest":
        return [*dependencies, *dev]
    core = [_floor(r) for r in dependencies if _name(r) in CORE]
    missing = set(CORE) - {_name(r) for r in core}
    if missing:
        raise ValueError(f"pyproject.toml lists no dependency on {', '.join(sorted(missing))}")
    rest = [r for r in [*dependencies, *dev] if _name(r) not in CORE and not _name(r).startswith(OLDEST_EXCLUDES)]
    return [*core, *rest]


def resolve(reqs: list[str]) -> list[str]:
    """``name==version`` of every distribution pip would install for ``reqs`` into an empty venv (a dry run)."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    done = subprocess.run([*command, "--report", "-", *reqs], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"pip could not resolve {' '.join(reqs)}")
    install = json.loads(done.stdout)["install"]
    return sorted(f"{i['metadata']['name'].lower()}=={i['metadata']['version']}" for i in install)


def venv_dir(leg: str, pins: list[str]) -> Path:
    """Where ``leg``'s venv with exactly ``pins`` lives: ``<root>/<leg>-<12 hex of the pins and the Python>``."""
    root = Path(os.environ.get("LIGHTNING_GRPO_VENVS", Path.home() / ".cache" / "lightning-grpo" / "venvs"))
    key = "\n".join([sys.version.split()[0], *pins]).encode()
    return root / f"{leg}-{hashlib.sha256(key).hexdigest()[:12]}"


def build(target: Path, pins: list[str]) -> None:
    """Create the venv at ``target`` with exactly ``pins``: built beside it, renamed into place once complete."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
    pip = [str(partial / "bin" / "python"), "-m", "pip", "install", "-qq", "--no-deps"]  # -qq: errors only
    subprocess.run([*pip, *pins], check=True, stdout=sys.stderr)
    for old in target.parent.glob(f"{target.name.rsplit('-', 1)[0]}-*"):
        if old.is_dir() and old != partial:
            shutil.rmtree(old)
    # The venv's scripts and activate files name it by path: point them at the final directory.
    for script in (partial / "bin").iterdir():
        if script.is_file() and not script.is_symlink() and bytes(partial) in script.read_bytes():
            script.write_bytes(script.read_bytes().replace(bytes(partial), bytes(target)))
    cfg = partial / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(str(partial), str(target)))
    partial.rename(target)


def main(argv: list[str]) -> int:
    """Print the directory of the leg's venv, building it first where no venv has its resolved versions."""
    if len(argv) != 1 or argv[0] not in LEGS:
        print(f"usage: python3 .ci/leg.py {{{'|'.join(LEGS)}}}", file=sys.stderr)
        return 2
    leg = argv[0]
    pins = resolve(requirements(leg))
    target = venv_dir(leg, pins)
    if (target / "bin" / "python").exists():
        print(f"{leg} leg: reusing {target}", file=sys.stderr)
    else:
        print(f"{leg} leg: building {target} ({len(pins)} distributions)", file=sys.stderr)
        build(target, pins)
    core = [p for p in pins if _name(p) in CORE]
    print(f"{leg} leg: {' '.join(core)}", file=sys.stderr)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
