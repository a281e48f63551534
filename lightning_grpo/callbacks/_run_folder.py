"""Where a run writes its adapter exports: never over another run's, and checked for writing before training."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info

if TYPE_CHECKING:
    from lightning_grpo.callbacks.adapter_export import AdapterExport

__all__ = ["choose_export_folder", "holds_exports"]


def choose_export_folder(export: AdapterExport, trainer: Trainer) -> tuple[Path, Exception | None]:
    """The folder for this run's exports, or the error to raise on every rank (run on rank zero).

    A folder that holds another run's exports is refused when the user chose it (``dirpath``) and replaced by the
    next free ``adapter_<n>`` beside it when it is the default; a resumed run, or ``overwrite=True``, keeps it. The
    folder is created and a file written and removed in it, so that an unwritable folder fails before training.
    """
    directory = export.directory(trainer)
    if holds_exports(directory) and not export._resumed and not export.overwrite:
        if export.dirpath is not None:
            found = ", ".join(sorted(path.name for path in directory.iterdir())[:5])
            return directory, FileExistsError(
                f"AdapterExport: {directory} already holds adapter exports of another run ({found}); set "
                "AdapterExport(overwrite=True) to replace them, or choose another dirpath"
            )
        directory = _next_free(directory)
        rank_zero_info(
            f"AdapterExport: the default folder holds an earlier run's exports; this run writes to {directory}"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".lightning_grpo-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return directory, PermissionError(
            f"AdapterExport cannot write to {directory} ({error.strerror or error}); set its dirpath to a writable "
            "folder (checked before training, so that no trained adapter is lost)"
        )
    return directory, None


def holds_exports(directory: Path) -> bool:
    """Whether ``directory`` exists and holds anything (an earlier run's exports)."""
    return directory.is_dir() and any(directory.iterdir())


def _next_free(directory: Path) -> Path:
    """``adapter_1``, ``adapter_2``, ... beside ``directory``: the first that holds nothing."""
    number = 1
    while holds_exports(directory.with_name(f"{directory.name}_{number}")):
        number += 1
    return directory.with_name(f"{directory.name}_{number}")
