"""On Ctrl-C or SIGTERM, save a resumable checkpoint of the last completed GRPO iteration and the adapter, then exit."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_grpo.checkpoint.loop_state import align_logger_step, resume_after_epoch_end

__all__ = ["SIGTERM_EXIT_CODE", "SaveOnInterrupt"]

#: The exit status of a run stopped by SIGTERM (128 + 15, as a shell reports it): never 0, so a scheduler does not
#: take a preempted job for a finished one.
SIGTERM_EXIT_CODE = 143


class SaveOnInterrupt(Callback):
    r"""When a run is stopped with Ctrl-C (SIGINT) or SIGTERM, save a checkpoint to resume from and export the adapter.

    **SIGTERM** (a cluster scheduler's preemption, ``kill``): the signal is only noted (this callback's handler
    replaces Lightning's for the training loop: Lightning 2.6's runs a collective inside the signal handler and lets
    each rank stop on its own, which can deadlock DDP), and the current GRPO iteration finishes and writes its
    metrics; when the next iteration starts every rank agrees whether any rank received it (one small all-reduce per
    iteration), so under DDP and FSDP2 all ranks stop after the same step. The checkpoint of that step and the
    adapter are saved (by every rank together), the resume command is printed, and the process exits with status
    :data:`SIGTERM_EXIT_CODE` (143), not 0 as Lightning alone would.

    **Ctrl-C**: Lightning turns it into a graceful shutdown and calls ``on_exception``; this callback then writes
    ``interrupted-step=<N>.ckpt`` (``N`` = ``trainer.global_step``, the optimizer steps completed) into the
    ``ModelCheckpoint``'s folder (or ``dirpath``), and the adapter in PEFT format beside the
    :class:`~lightning_grpo.callbacks.AdapterExport` exports (or beside the checkpoint). Stopped while sampling or
    scoring, the module still holds the last completed iteration, which is what is saved: resuming from the file
    repeats the interrupted iteration exactly. Once an iteration's first optimizer step has begun (or its
    ``training_step`` has returned), Ctrl-C is only noted (one line says so) and the iteration finishes first, its
    metrics written, then it is saved: an interrupt never loses more than the current iteration. A second Ctrl-C
    stops at once; nothing is saved from a half-updated adapter then, and the message names the newest checkpoint on
    disk and the command that resumes from it.
    Runs of several processes (DDP, FSDP2) are not saved on Ctrl-C: each rank stops at its own point, possibly inside
    a collective; the message names the last checkpoint and the command (SIGTERM is saved: the ranks agree first).
    Resume with ``--ckpt_path <the file>`` (docs/distributed.md).

    **The metrics of a resumed run** continue those written before the stop, each step once: a checkpoint is saved
    only where every finished iteration has written its metrics and none other has, and Lightning resumes its logger
    step at the first iteration not written (:func:`~lightning_grpo.checkpoint.loop_state.align_logger_step`). So
    does a checkpoint ``ModelCheckpoint`` saves at an epoch's end, its epoch counted as the uninterrupted run's
    (:func:`~lightning_grpo.checkpoint.loop_state.resume_after_epoch_end`, on saving and on loading). A signal that
    comes during the last iteration of the run stops nothing: the run ends as usual.

    Args:
        dirpath: Folder of the checkpoint; ``None`` uses the ``ModelCheckpoint``'s folder, or ``checkpoints`` in the
            run's log folder; with neither (no logger, no checkpointing, no ``default_root_dir``), a new folder under
            ``~/.cache/lightning_grpo/interrupted`` rather than the working directory.
        export_adapter: Also export the adapter.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import SaveOnInterrupt
        >>> trainer = Trainer(callbacks=[SaveOnInterrupt()], logger=False)
    """

    def __init__(self, dirpath: str | Path | None = None, export_adapter: bool = True) -> None:
        self.dirpath = dirpath
        self.export_adapter = export_adapter
        self._step_at_batch_start: int | None = None  # set from an iteration's start to its on_train_batch_end
        self._processed_at_start: int | None = None  # the loop's processed batches when the iteration started
        self._stopped = False  # stopped by a signal, checkpoint saved
        self._sigterm = False  # SIGTERM received, not yet acted on
        self._fallback: Path | None = None  # the checkpoint folder when no run folder is known
        self._updating = False  # an optimizer step of the current iteration has begun
        self._sigint = False  # Ctrl-C received while an iteration finished, acted on when the next one starts
        self._trainer: Trainer | None = None  # read by the Ctrl-C handler

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Note SIGTERM only; Lightning restores the handlers it found when fit ends."""
        self._sigterm = self._sigint = self._updating = False
        self._trainer, self._processed_at_start = trainer, _processed(trainer)
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            signal.signal(signal.SIGTERM, self._note_sigterm)
            if trainer.world_size == 1:  # several ranks each stop at their own point: no deferral there
                signal.signal(signal.SIGINT, self._on_sigint)

    def _note_sigterm(self, signum: int, frame: Any) -> None:
        self._sigterm = True

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """Ctrl-C: stop now, unless an iteration is finishing (then once: finish it, then save and stop)."""
        if self._sigint or not self._finishing(self._trainer):
            raise KeyboardInterrupt
        self._sigint = True
        print(
            "\nCtrl-C: finishing this GRPO iteration's update, then saving a checkpoint (Ctrl-C again stops now, "
            "without saving this iteration)",
            file=sys.stderr,
            flush=True,
        )

    def _finishing(self, trainer: Trainer | None) -> bool:
        """Whether the current iteration has changed the adapter or ended its ``training_step``: saved only once its
        metrics are written, when the next iteration starts."""
        return self._updating or (trainer is not None and _processed(trainer) != self._processed_at_start)

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._updating = True

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Stop if a signal came during the previous iteration (its metrics are written now); else note the start."""
        if self._sigint:  # Ctrl-C came while the previous iteration finished
            self._stop(trainer, pl_module, "Interrupted", KeyboardInterrupt())
        received = self._sigterm or trainer.received_sigterm
        if trainer.world_size > 1:  # a collective at the same point on every rank: they stop after the same step
            received = trainer.strategy.reduce_boolean_decision(received, all=False)
        if received:
            self._stop(trainer, pl_module, "Stopped by SIGTERM", SIGTERMException(SIGTERM_EXIT_CODE))
        self._step_at_batch_start, self._processed_at_start = trainer.global_step, _processed(trainer)
        self._updating = False

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_at_batch_start = None

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._sigint or self._sigterm:
            rank_zero_info("The signal came during the run's last iteration: the run has ended as usual.")

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """A checkpoint saved inside an iteration (this callback's, on a signal) or at an epoch's end
        (``ModelCheckpoint``'s) resumes the logger at the next iteration's step, and the epoch as it goes on."""
        align_logger_step(checkpoint, num_batches=trainer.num_training_batches)

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """A checkpoint saved at an epoch's end without this callback resumes as one saved with it (before Lightning
        restores its loops from it)."""
        resume_after_epoch_end(checkpoint)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            self._on_sigterm(trainer, pl_module, exception)
            return
        if not isinstance(exception, KeyboardInterrupt) or not trainer.training or self._stopped:
            return
        if trainer.world_size > 1:  # ranks stop at different points, possibly inside a collective: no safe save
            rank_zero_warn(
                f"Interrupted: a run of several processes is not saved on Ctrl-C. {self._last_saved(trainer)}"
            )
            return
        started = self._step_at_batch_start
        in_step = started is not None and _processed(trainer) == self._processed_at_start  # training_step runs
        if in_step and (self._updating or trainer.global_step != started):
            rank_zero_warn(
                f"Interrupted inside the update of one GRPO iteration (from step {started}): the adapter is partly "
                f"updated, so it was not saved. {self._last_saved(trainer)}"
            )
            return
        if self._finishing(trainer):
            rank_zero_warn(
                f"Interrupted after the update of one GRPO iteration (step {trainer.global_step}), before its metrics "
                f"were written, so it was not saved. {self._last_saved(trainer)}"
            )
            return
        self._save(trainer, pl_module, "Interrupted")

    def _stop(self, trainer: Trainer, pl_module: LightningModule, why: str, exception: BaseException) -> None:
        """Save (every rank), then raise ``exception``: Lightning's graceful shutdown follows."""
        self._stopped = True
        self._save(trainer, pl_module, why)
        raise exception

    def _last_saved(self, trainer: Trainer) -> str:
        """The newest checkpoint in the run's checkpoint folder and the command that resumes from it."""
        folder = self.checkpoint_path(trainer).parent
        found = sorted(folder.glob("*.ckpt"), key=lambda path: path.stat().st_mtime) if folder.is_dir() else []
        if not found:
            return f"No checkpoint was saved yet (in {folder}); start again with: {resume_command(None)}"
        return f"The last checkpoint is {found[-1]}; resume with: {resume_command(found[-1])}"

    def _on_sigterm(self, trainer: Trainer, pl_module: LightningModule, exception: SIGTERMException) -> None:
        """Lightning's own SIGTERM stop (its handler got the signal, not this one's): exit non-zero all the same."""
        if exception.code in (None, 0):
            exception.code = SIGTERM_EXIT_CODE
        if self._stopped or not trainer.training:
            return
        if trainer.world_size > 1 or self._step_at_batch_start is not None:
            rank_zero_warn("Stopped by SIGTERM mid-iteration: no checkpoint saved; resume from the last checkpoint.")
            return
        self._save(trainer, pl_module, "Stopped by SIGTERM")

    def _save(self, trainer: Trainer, pl_module: LightningModule, why: str) -> None:
        """Save the checkpoint (every rank calls it) and the adapter; print where, and how to resume."""
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        message = f"{why} after step {trainer.global_step}: saved {path}"
        if self.export_adapter and callable(getattr(pl_module, "export_adapter", None)):
            adapter = self._adapter_path(trainer)
            if getattr(pl_module, "export_adapter_all_ranks", False) or trainer.is_global_zero:
                pl_module.export_adapter(adapter)
            message += f"; the adapter is in {adapter}"
        rank_zero_info(f"{message}\nResume with: {resume_command(path)}")

    def checkpoint_path(self, trainer: Trainer) -> Path:
        """``<folder>/interrupted-step=<global_step>.ckpt``."""
        folder = self.dirpath or getattr(trainer.checkpoint_callback, "dirpath", None)
        if folder is None and not trainer.loggers and Path(trainer.default_root_dir).resolve() == Path.cwd().resolve():
            folder = self._fallback_folder()  # no run folder is known: not the working directory
        if folder is None:
            run = trainer.log_dir if trainer.loggers else trainer.default_root_dir
            folder = Path(run or trainer.default_root_dir) / "checkpoints"
        return Path(folder) / f"interrupted-step={trainer.global_step}.ckpt"

    def _fallback_folder(self) -> Path:
        """``~/.cache/lightning_grpo/interrupted/<date>-<time>-<pid>`` (``XDG_CACHE_HOME`` honoured), chosen once."""
        if self._fallback is None:
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            run = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            self._fallback = cache / "lightning_grpo" / "interrupted" / run
        return self._fallback

    def _adapter_path(self, trainer: Trainer) -> Path:
        name = f"interrupted-step-{trainer.global_step}"
        for callback in trainer.callbacks:
            if callable(getattr(callback, "path_for", None)):  # AdapterExport: beside its exports
                return callback.path_for(trainer, name)
        return self.checkpoint_path(trainer).with_name(name)


def _processed(trainer: Trainer) -> int | None:
    """Batches whose ``training_step`` has returned, in the whole run (Lightning's fit loop counts them)."""
    fit_loop = getattr(trainer, "fit_loop", None)
    return None if fit_loop is None else fit_loop.epoch_loop.batch_progress.total.processed


def resume_command(checkpoint: Path | None, argv: list[str] | None = None) -> str:
    """The command line that resumes from ``checkpoint``: this one (``argv``, default ``sys.argv``) with
    ``--ckpt_path``, or the Python call for a run started from Python; without a checkpoint, the command itself.

    Example::

        >>> argv = ["/usr/bin/lightning-grpo", "fit", "--config", "my run.yaml", "--ckpt_path", "old.ckpt"]
        >>> resume_command(Path("ckpt/interrupted-step=3.ckpt"), argv)
        "lightning-grpo fit --config 'my run.yaml' --ckpt_path ckpt/interrupted-step=3.ckpt"
    """
    argv = list(sys.argv if argv is None else argv)
    program = Path(argv[0]).name if argv else ""
    if program not in ("lightning-grpo", "__main__.py") or argv[1:2] != ["fit"]:
        return (
            "trainer.fit(module, data)"
            if checkpoint is None
            else f"trainer.fit(module, data, ckpt_path={str(checkpoint)!r})"
        )
    args, skip = [], False
    for arg in argv[1:]:  # without the checkpoint it may have resumed from
        if not skip and not arg.startswith("--ckpt_path"):
            args.append(arg)
        skip = arg == "--ckpt_path"
    name = "lightning-grpo" if program == "lightning-grpo" else "python -m lightning_grpo"
    return f"{name} {shlex.join(args if checkpoint is None else [*args, '--ckpt_path', str(checkpoint)])}"
