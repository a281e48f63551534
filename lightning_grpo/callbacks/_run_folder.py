"""Where a run writes: its folder, read without a collective, and its adapter exports (never over another run's,
checked for writing before training)."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info

__all__ = ["choose_export_folder", "holds_exports", "run_folder"]


def run_folder(trainer: Trainer) -> Path:
    """The run's folder as this process sees it: the first logger's ``log_dir`` (CSV, TensorBoard) or ``save_dir``,
    else ``trainer.default_root_dir``.

    ``Trainer.log_dir`` is the same folder but broadcasts it from rank zero: a collective that every rank must call.
    A callback that acts on rank zero alone reads this instead (under DDP or FSDP2 a broadcast on one rank hangs the
    run, or pairs with another collective of the other ranks).
    """
    loggers = getattr(trainer, "loggers", None)  # a stand-in trainer may have none
    if loggers:
        logger = loggers[0]
        folder = logger.log_dir if isinstance(logger, CSVLogger | TensorBoardLogger) else logger.save_dir
        return Path(folder or trainer.default_root_dir)
    return Path(trainer.default_root_dir)


def choose_export_folder(directory: Path, *, chosen: bool, keep: bool) -> tuple[Path, Exception | None]:
    """The folder for this run's exports, or the error to raise on every rank (run on rank zero).

    A folder that holds another run's exports is refused when the user ``chosen`` it and replaced by the next free
    ``adapter_<n>`` beside it when it is the default; with ``keep`` (a resumed run, or ``overwrite=True``) it is
    kept. The folder is created and a file written and removed in it, so that an unwritable folder fails before
    training.

    Args:
        directory: Where the exports would go.
        chosen: The user chose the folder (``AdapterExport(dirpath=...)``) rather than taking the default.
        keep: Write into the folder even if it holds exports.
    """
    if holds_exports(directory) and not keep:
        if chosen:
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
