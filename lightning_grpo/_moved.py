"""Old import paths keep working: every module or name that moved is listed here, and warns once with its new path.

Two kinds of shim, one helper each, and no shim code anywhere else:

* a **module** that moved (``lightning_grpo.step.update`` is now ``lightning_grpo.iteration.update``) is listed in
  :data:`MOVED_MODULES`; :func:`install` puts a finder on ``sys.meta_path`` that answers ``import`` of the old name
  with the new module itself (the same object: ``isinstance`` checks and monkey-patches see one module), after a
  ``DeprecationWarning`` naming the new path;
* a **name** that moved out of a module that stays (``lightning_grpo.step.StepContext``) is served by the module's
  ``__getattr__ = moved_names(__name__, {...})``, which imports the new home on first use and warns once per name.

Each old path warns once per process (:data:`WARNED`), however often it is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["MOVED_MODULES", "WARNED", "Moved", "install", "moved_names", "resolve", "warn_moved"]

#: Old dotted module name -> the module that replaced it (docs/index.md, "Layout"). Sorted by old name.
MOVED_MODULES: Mapping[str, str] = {
    "lightning_grpo.algorithms.logprobs": "lightning_grpo.algorithms.logprob_kernels",
    "lightning_grpo.algorithms.process": "lightning_grpo.algorithms.process_supervision",
    "lightning_grpo.rewards.base": "lightning_grpo.rewards.reward_functions",
    "lightning_grpo.rewards.model": "lightning_grpo.rewards.reward_model",
    "lightning_grpo.rewards.process_model": "lightning_grpo.rewards.process_supervision",
    "lightning_grpo.rewards.steps": "lightning_grpo.rewards.process_supervision",
    "lightning_grpo.rollout.steps": "lightning_grpo.rollout.process_supervision",
    "lightning_grpo.rollout.vllm_engine": "lightning_grpo.backends.vllm_engine",
    "lightning_grpo.rollout.vllm_files": "lightning_grpo.backends.vllm_files",
    "lightning_grpo.rollout.vllm_settings": "lightning_grpo.backends.vllm_settings",
    "lightning_grpo.rollout.vllm_start": "lightning_grpo.backends.vllm_start",
    "lightning_grpo.step.batch": "lightning_grpo.iteration.types",
    "lightning_grpo.step.context": "lightning_grpo.iteration.context",
    "lightning_grpo.step.cpu_threads": "lightning_grpo.iteration.cpu_threads",
    "lightning_grpo.step.dynamic_sampling": "lightning_grpo.iteration.dynamic_sampling",
    "lightning_grpo.step.finite": "lightning_grpo.iteration.nonfinite",
    "lightning_grpo.step.fit_checks": "lightning_grpo.iteration.fit_checks",
    "lightning_grpo.step.process": "lightning_grpo.iteration.process_supervision",
    "lightning_grpo.step.seeding": "lightning_grpo.iteration.seeding",
    "lightning_grpo.step.timing": "lightning_grpo.iteration.timing",
    "lightning_grpo.step.update": "lightning_grpo.iteration.update",
    "lightning_grpo.step.zero_signal": "lightning_grpo.iteration.zero_signal",
    "lightning_grpo.testing.datamodule": "lightning_grpo.testing.task_datamodule",
    "lightning_grpo.testing.demo": "lightning_grpo.demo",
    "lightning_grpo.testing.model": "lightning_grpo.testing.tiny_model",
}

#: The old paths that have warned in this process.
WARNED: set[str] = set()


def _first_outside() -> int:
    """The ``stacklevel`` of the first frame outside this module and the import system: the user's import line.

    ``warnings.warn`` does not count the import system's frames once ``stacklevel > 1``; neither does this.
    """
    frame, level = sys._getframe(2), 2  # 0: this function, 1: warn_moved (stacklevel 1)
    while frame is not None and (frame.f_code.co_filename == __file__ or "importlib" in frame.f_code.co_filename):
        level += frame.f_code.co_filename == __file__
        frame = frame.f_back
    return level


def warn_moved(old: str, new: str, note: str = "") -> None:
    """Warn (``DeprecationWarning``) that ``old`` moved to ``new``, once per ``old`` in a process."""
    if old in WARNED:
        return
    WARNED.add(old)
    warnings.warn(f"{old} moved to {new}{note}; import it from there", DeprecationWarning, stacklevel=_first_outside())


def resolve(path: str) -> Any:
    """The module or attribute a dotted ``path`` names (``package.module`` or ``package.module.name``).

    Example::

        >>> resolve("os.path.join") is __import__("os").path.join
        True
    """
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as error:
        module, _, name = path.rpartition(".")
        if not module or error.name != path:
            raise
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Moved:
    """Where a moved name lives now.

    Attributes:
        new: The dotted path the warning names (``package.module.name``).
        load: What the old name gives instead, when it keeps an old signature (``package.module.name``); ``None``:
            the object at ``new`` itself.
        note: Appended to the warning after the new path (e.g. ``" (its arguments are now plain tensors)"``).
    """

    new: str
    load: str | None = None
    note: str = ""


def moved_names(module: str, names: Mapping[str, str | Moved]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` serving names that moved out of ``module``, each warning once.

    Args:
        module: The module the old names are read from (its ``__name__``).
        names: Old name -> its new dotted path, or a :class:`Moved`.

    Example::

        >>> __getattr__ = moved_names("my_package.old", {"join": "os.path.join"})
        >>> import warnings
        >>> with warnings.catch_warnings(record=True):
        ...     __getattr__("join") is __import__("os").path.join
        True
    """
    table = {name: Moved(target) if isinstance(target, str) else target for name, target in names.items()}

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        moved = table[name]
        warn_moved(f"{module}.{name}", moved.new, moved.note)
        return resolve(moved.load or moved.new)

    __getattr__.__doc__ = f"Names that moved out of {module}, with a DeprecationWarning once each: {sorted(table)}."
    return __getattr__


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the import of a module in :data:`MOVED_MODULES` with the module that replaced it."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # the new modules' own specs

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED_MODULES[spec.name]
        warn_moved(spec.name, new)
        module = importlib.import_module(new)
        self._specs[new] = module.__spec__  # the import system writes the old name's spec over it next
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the new module is imported already): give the module its own spec back."""
        module.__spec__ = self._specs[module.__name__]


def install() -> None:
    """Put the finder of moved modules on ``sys.meta_path`` (once; :mod:`lightning_grpo` calls it at import)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
