"""RankFailureWatch: a failure on one rank, in any phase of a fit, stops every rank within seconds and names it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_grpo.policy.finite import NonFiniteError
from lightning_grpo.rank_failures import (
    CAUSE_WAIT_S,
    POLL_S,
    FailureBoard,
    FailureRecord,
    FailureWatch,
    failure_message,
    is_agreed,
    is_communication_error,
    leave_process_group,
)
from lightning_grpo.rollout.rank_agreement import RankFailureError

__all__ = ["RankFailureWatch"]

#: Errors every rank raises together after a collective (nothing to tell the others), or a stop the user asked for.
_AGREED = (RankFailureError, NonFiniteError, KeyboardInterrupt, SystemExit, SIGTERMException)


class RankFailureWatch(Callback):
    """On several processes: a rank that raises tells the others through the store; every rank raises
    :class:`~lightning_grpo.rollout.rank_agreement.RankFailureError` naming the failing rank, where and why.

    ``GRPOModule`` adds it to every fit (``configure_callbacks``). At ``setup`` it moves itself first among the
    trainer's callbacks (its ``on_exception`` must run before any other's, some of which run collectives); at
    ``on_fit_start``, once the set-up is done (whose refusals every rank raises alike, unchanged), it starts a
    :class:`~lightning_grpo.rank_failures.FailureWatch` thread. In ``on_exception``, a rank whose own code raised posts
    its record, waits until every peer read it, and leaves the process group (which breaks the collective its peers wait
    in); a rank whose collective broke reads the peers' records. Lightning's exception handling then runs to its end
    (the other callbacks' ``on_exception``, the loggers' ``finalize``, the strategy's teardown) and the agreed error is
    raised in place of the original, chained to it. Errors every rank raises together (the rollout's vote, the
    non-finite guard) and interrupts pass through unchanged. On one process it does nothing.

    A rank that is not inside a collective (say, a long agent rollout) stops at its next one, the rollout's vote, and
    prints its peer's cause as soon as it is read. A peer killed by the OS leaves no record: the error says so.
    ``ddp_spawn`` runs workers without Lightning's exception hooks: there the launcher re-raises a worker's traceback.
    """

    def __init__(self) -> None:
        self._watch: FailureWatch | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        trainer.callbacks = [self, *(callback for callback in trainer.callbacks if callback is not self)]

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # from here on: the set-up refuses alike on every rank, and its errors pass as they are
        board = FailureBoard.of_process_group(Path(trainer.default_root_dir) / "rank_failures")
        self._watch = None if board is None else FailureWatch(board).start()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        watch = self._watch
        if watch is None or isinstance(exception, _AGREED) or is_agreed(exception):
            self._stop()
            return
        board = watch.board
        failed_here = not is_communication_error(exception)  # else a peer left the collective this rank waited in
        if failed_here:
            board.post(FailureRecord.of(exception, board.rank))
            board.wait_for_acknowledgements()
            records = {**board.records(), **watch.peers()}
        else:
            records = _wait_for_records(watch)
        self._stop()
        if failed_here:
            leave_process_group()  # after every peer read the record: gloo peers' collectives with this rank end now
        error = _agreed_error(records, board, exception)
        _raise_after_teardown(trainer, error, exception)

    def _stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None


def _wait_for_records(watch: FailureWatch) -> dict[int, Any]:
    """The peers' records, waiting up to ``CAUSE_WAIT_S`` for one (a broken collective: some peer left)."""
    deadline = time.monotonic() + CAUSE_WAIT_S
    while not (records := watch.peers()) and time.monotonic() < deadline:
        time.sleep(POLL_S / 5)
    return records or {r: rec for r, rec in watch.board.records().items() if r != watch.board.rank}


def _agreed_error(records: dict[int, FailureRecord], board: FailureBoard, exception: BaseException) -> RankFailureError:
    """The error this rank raises: the records' message, or that a collective broke and no rank said why."""
    own = f"{type(exception).__name__}: {exception}".splitlines()[0][:300]
    if not records:
        message = (
            f"a collective failed on rank {board.rank} of {board.world_size} and no rank recorded a cause: a peer "
            f"probably died without raising (out of memory, a signal); see the other ranks' logs. This rank: {own}"
        )
        return RankFailureError(message, {})
    causes = {rank: record.cause for rank, record in records.items()}
    return RankFailureError(failure_message(records, board.rank, board.world_size, own), causes)


def _raise_after_teardown(trainer: Trainer, error: RankFailureError, exception: BaseException) -> None:
    """Raise ``error`` (chained to ``exception``) once Lightning finished handling ``exception``: from the trainer's
    teardown, which Lightning calls last, so no other callback's ``on_exception``, logger or teardown is skipped."""
    teardown = trainer._teardown

    def teardown_then_raise() -> None:
        del trainer._teardown  # the next fit gets the trainer's own method back
        teardown()
        trainer.state.stage = None
        raise error from exception

    trainer._teardown = teardown_then_raise  # type: ignore[method-assign]
