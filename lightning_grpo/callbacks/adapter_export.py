"""Export the LoRA adapter in PEFT format during and at the end of training."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_positive_int
from lightning_grpo.callbacks._run_folder import choose_export_folder, run_folder
from lightning_grpo.callbacks.iteration_counter import IterationCounter
from lightning_grpo.rank_failures import agreed

__all__ = ["AdapterExport"]


class AdapterExport(IterationCounter):
    r"""Write the adapter with ``pl_module.export_adapter(path)``, loadable by ``PeftModel.from_pretrained`` and vLLM.

    Exports go to ``<dirpath>/adapter/step-<global_step>`` every ``every_n_iterations`` iterations and to
    ``<dirpath>/adapter/final`` when training ends. Without ``dirpath`` they go to the run's own folder: the logger's
    versioned ``log_dir`` (``runs/tiny/version_3/adapter/final``), or without a logger ``default_root_dir``, where a
    rerun whose ``adapter`` folder already holds exports writes to ``adapter_1``, ``adapter_2``, ... instead. Exports
    are never replaced silently: an explicit ``dirpath`` that already holds another run's exports is refused at fit
    start unless ``overwrite=True`` (a resumed run continues in its folder). The folder is also checked for writing at
    fit start, and an export that fails is written to a temporary folder instead, whose path the error gives.

    Iterations are ``training_step`` calls; the directory is named by ``trainer.global_step`` (optimizer steps, of
    which an iteration may take several: docs/glossary.md) so that it matches the ``step=<N>`` of Lightning's
    checkpoints. The iteration count is saved in checkpoints.

    Rank zero writes; all ranks then meet at ``trainer.strategy.barrier()`` so none runs ahead while it writes. A
    module whose export is a collective (under FSDP2 the sharded adapter must be gathered, and every rank has to
    take part) sets ``export_adapter_all_ranks = True``: :meth:`_export` then calls ``export_adapter`` on every
    rank, and the module itself writes on rank zero only. Override :meth:`_export` to change where or how it writes.

    Args:
        dirpath: Root directory; ``None`` uses ``trainer.default_root_dir``.
        every_n_iterations: Export after every this many iterations (the n-th, 2n-th, ...); ``None`` exports only the
            final adapter.
        overwrite: Replace exports that ``<dirpath>/adapter`` already holds from an earlier run.

    Raises:
        ValueError: If ``every_n_iterations`` is neither ``None`` nor an int >= 1.
        FileExistsError: At fit start, if ``<dirpath>/adapter`` holds another run's exports and ``overwrite`` is off.
        PermissionError: At fit start, if the export folder cannot be written.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import AdapterExport
        >>> export = AdapterExport(dirpath="runs/demo", every_n_iterations=100)
        >>> trainer = Trainer(callbacks=[export], logger=False)
        >>> export.path_for(trainer, "final").as_posix()
        'runs/demo/adapter/final'
    """

    def __init__(
        self, dirpath: str | Path | None = None, every_n_iterations: int | None = None, overwrite: bool = False
    ) -> None:
        self.dirpath = dirpath
        self.every_n_iterations = check_positive_int("every_n_iterations", every_n_iterations, allow_none=True)
        self.overwrite = overwrite
        self._directory: Path | None = None  # chosen at fit start
        self._resumed = False
        super().__init__()

    def directory(self, trainer: Trainer) -> Path:
        """The folder of this run's exports (chosen at fit start; before that, where it would be)."""
        if self._directory is not None:
            return self._directory
        if self.dirpath is not None:
            return Path(self.dirpath) / "adapter"
        return run_folder(trainer) / "adapter"  # rank zero alone chooses: no collective here

    def path_for(self, trainer: Trainer, name: str) -> Path:
        """Where the export ``name`` (``step-<N>`` or ``final``) goes."""
        return self.directory(trainer) / name

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and not callable(getattr(pl_module, "export_adapter", None)):
            raise TypeError(f"AdapterExport needs a module with export_adapter(path), got {type(pl_module).__name__}")

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._directory = None
        choice = None
        if trainer.is_global_zero:  # a resumed run goes on in its folder
            keep = self._resumed or self.overwrite
            choice = choose_export_folder(self.directory(trainer), chosen=self.dirpath is not None, keep=keep)
        directory, error = trainer.strategy.broadcast(choice)  # every rank raises, or none
        if error is not None:
            raise agreed(error)
        self._directory = directory

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._resumed = True  # a resumed run goes on writing into its folder

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.iterations += 1
        if self.every_n_iterations is not None and self.iterations % self.every_n_iterations == 0:
            self._save(trainer, pl_module, f"step-{trainer.global_step}")

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer, pl_module, "final")

    def _save(self, trainer: Trainer, pl_module: LightningModule, name: str) -> None:
        path = self.path_for(trainer, name)
        try:
            self._export(trainer, pl_module, path)
        except OSError as error:  # never lose the trained adapter: write it where we can, then say where
            fallback = Path(tempfile.mkdtemp(prefix="lightning_grpo-adapter-")) / name
            self._export(trainer, pl_module, fallback)
            raise OSError(
                f"AdapterExport could not write {path} ({error}); the adapter was saved to {fallback}"
            ) from error
        trainer.strategy.barrier(f"AdapterExport.{name}")

    def _export(self, trainer: Trainer, pl_module: LightningModule, path: Path) -> None:
        """Call ``pl_module.export_adapter(path)`` on rank zero, or on every rank if the module asks for it.

        Args:
            trainer: The trainer.
            pl_module: The module; it must have ``export_adapter(path)``. With ``export_adapter_all_ranks = True``
                every rank calls it (for exports that gather shards), and the module must write on rank zero only.
            path: The export directory.
        """
        if getattr(pl_module, "export_adapter_all_ranks", False) or trainer.is_global_zero:
            pl_module.export_adapter(path)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(dirpath=str(self.dirpath), every_n_iterations=self.every_n_iterations)
