"""A rank's failure reaches the other ranks out of band: through the process group's store, not a collective.

The rollout's vote (:mod:`lightning_grpo.rollout.rank_agreement`) agrees on a failed rollout before the next
collective. Everywhere else a rank that raises leaves its peers inside a collective no vote can reach (DDP's gradient
all-reduce, FSDP2's all-gathers, a checkpoint barrier): gloo then reports "Connection closed by peer" and NCCL waits
out ``GRPOConfig.faults.collective_timeout_s``. So the failing rank writes a :class:`FailureRecord` (its rank, where it
failed, the cause) to a :class:`FailureBoard`, the store every rank already talks to (and a JSON file in the run
folder, read when the store is gone); a :class:`FailureWatch` thread on every rank polls the board once per
``POLL_S`` (one loopback request: no collective, no host sync on the training thread), acknowledges and prints each
peer's record, and under NCCL aborts the process groups so that the blocked collective returns. The failing rank waits
for the acknowledgements (rank 0 hosts the store under torchrun-less launchers: it must outlive its readers), then
leaves the process group, which wakes gloo peers at once. :class:`~lightning_grpo.callbacks.RankFailureWatch` wires
it into a fit; every rank then raises :class:`~lightning_grpo.rollout.rank_agreement.RankFailureError`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from lightning_grpo.rollout.rank_agreement import CAUSE_CHARS

__all__ = [
    "FailureBoard",
    "FailureRecord",
    "FailureWatch",
    "agreed",
    "failure_message",
    "is_agreed",
    "is_communication_error",
]

#: Seconds between two looks at the board by the watching thread.
POLL_S = 0.5
#: Seconds a failing rank waits for its peers to acknowledge its record before it leaves the process group.
ACK_WAIT_S = 20.0
#: Seconds a rank whose collective broke waits for a peer's record before it says that no rank left one.
CAUSE_WAIT_S = 10.0
#: Seconds a store request may take before the board treats the store as gone (its host rank exited).
STORE_TIMEOUT_S = 5.0
#: What a collective raises when a peer left or the group was aborted (gloo and NCCL messages).
_BROKEN = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote worker crashing",
    "NCCL",
    "aborted",
    "Default process group has not been initialized",
)
_AGREED = "_lightning_grpo_agreed"  # the attribute of an error that every rank raises together
_FITS = itertools.count(1)
E = TypeVar("E", bound=BaseException)  # multi-process fits of this process: the same sequence on every rank


@dataclass(frozen=True)
class FailureRecord:
    """What one failing rank tells the others.

    Attributes:
        rank: The failing rank.
        cause: ``"ExceptionType: message"``, at most ``CAUSE_CHARS`` characters.
        where: The hook (and, inside it, the package function) that raised, e.g. ``"training_step, in
            lightning_grpo.rewards.reward_functions.RewardFunctions.__call__"``.
        host: The failing rank's host name.
        pid: Its process id.
        time: When it failed (seconds since the epoch).
    """

    rank: int
    cause: str
    where: str
    host: str
    pid: int
    time: float

    @classmethod
    def of(cls, error: BaseException, rank: int) -> FailureRecord:
        """The record of ``error`` raised on ``rank`` (this process)."""
        cause = f"{type(error).__name__}: {error}"[:CAUSE_CHARS]
        return cls(rank, cause, where_raised(error), socket.gethostname(), os.getpid(), time.time())

    def to_json(self) -> str:
        """The record as one JSON object."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FailureRecord:
        """The record written by :meth:`to_json`."""
        return cls(**json.loads(text))


def agreed(error: E) -> E:
    """``error``, marked as raised on every rank together after a collective (nothing to tell the other ranks)."""
    setattr(error, _AGREED, True)
    return error


def is_agreed(error: BaseException) -> bool:
    """Whether :func:`agreed` marked ``error``."""
    return bool(getattr(error, _AGREED, False))


def where_raised(error: BaseException) -> str:
    """The Lightning hook that ``error`` left, and the innermost function of the package it was raised in."""
    hook, inner = None, None
    frame_summary = error.__traceback__
    while frame_summary is not None:
        frame = frame_summary.tb_frame
        name = frame.f_code.co_name
        if name in ("_call_lightning_module_hook", "_call_callback_hooks", "_call_strategy_hook"):
            hook = _hook_name(frame.f_locals)
        elif frame.f_globals.get("__name__", "").startswith("lightning_grpo."):
            inner = f"{frame.f_globals['__name__']}.{frame.f_code.co_qualname}"
        frame_summary = frame_summary.tb_next
    parts = [part for part in (hook, f"in {inner}" if inner else None) if part]
    return ", ".join(parts) or "outside the trainer's hooks"


def _hook_name(local: dict[str, Any]) -> str:
    """``training_step`` or ``SampleLogger.on_train_batch_end``: a Lightning hook call's name from its frame."""
    hook = str(local.get("hook_name", "a hook"))
    callback = local.get("callback")
    return f"{type(callback).__name__}.{hook}" if callback is not None else hook


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` (or what it chains) is a collective that broke because a peer left or the group aborted."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, dist.DistError) or any(text in str(seen) for text in _BROKEN):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def failure_message(records: dict[int, FailureRecord], rank: int, world_size: int, own: str | None) -> str:
    """The error every rank raises: each failing rank, where and why, and which rank this is."""
    failing = sorted(records)
    which = f"rank {failing[0]}" if len(failing) == 1 else "ranks " + ", ".join(str(r) for r in failing)
    lines = "\n".join(f"  rank {r} ({records[r].where}): {records[r].cause}" for r in failing)
    mine = "" if own is None or rank in records else f", stopped by: {own}"
    return (
        f"the training failed on {which} of {world_size}, so every rank stops here (this is rank {rank}{mine}):\n"
        f"{lines}"
    )


class FailureBoard:
    """Where failing ranks leave their records: a namespace of the process group's store, and a folder.

    Keys (under ``lightning_grpo/rank_failures/<restart>/<fit>/``): ``cause/<rank>`` (a record), ``failed`` (a counter
    bumped after each record), ``ack/<rank>`` (how many peers read that rank's record).

    Args:
        store: A connection of this process to the store (a clone: the watching thread uses it alone).
        rank: This process's rank.
        world_size: Number of processes.
        folder: Where each record is also written as ``rank<r>.json`` (read when the store is gone); ``None``: nowhere.
    """

    def __init__(self, store: Any, rank: int, world_size: int, folder: Path | None) -> None:
        self.store, self.rank, self.world_size, self.folder = store, rank, world_size, folder

    @classmethod
    def of_process_group(cls, root: Path | None) -> FailureBoard | None:
        """A new board for the fit that starts (its own keys, and folder ``<root>/fit<N>``); ``None`` on one process."""
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        fit = next(_FITS)
        folder = None if root is None else root / f"fit{fit}"
        store = dist.distributed_c10d._get_default_store().clone()  # its own connection, for another thread
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefixed = dist.PrefixStore(f"lightning_grpo/rank_failures/{restart}/{fit}/", store)
        return cls(prefixed, dist.get_rank(), dist.get_world_size(), folder)

    def post(self, record: FailureRecord) -> None:
        """Leave this rank's record: the file first (it outlives the store), then the store."""
        if self.folder is not None:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                draft = self.folder / f".rank{record.rank}.json.tmp"
                draft.write_text(record.to_json(), encoding="utf-8")
                draft.replace(self.folder / f"rank{record.rank}.json")
            except OSError:
                pass  # a full or read-only disk: the store still carries it
        try:
            self.store.set(f"cause/{record.rank}", record.to_json())
            self.store.add("failed", 1)
        except Exception:  # the store's host already left: the file is all there is
            pass

    def count(self) -> int:
        """How many records were posted (0 while none; raises when the store is gone)."""
        return self.store.add("failed", 0) if self.store.check(["failed"]) else 0

    def records(self) -> dict[int, FailureRecord]:
        """Every posted record, from the store, else from the folder."""
        found: dict[int, FailureRecord] = {}
        for peer in range(self.world_size):
            try:
                if self.store.check([f"cause/{peer}"]):
                    found[peer] = FailureRecord.from_json(self.store.get(f"cause/{peer}"))
            except Exception:
                break
        return found or self._records_in_folder()

    def _records_in_folder(self) -> dict[int, FailureRecord]:
        if self.folder is None:
            return {}
        found = {}
        for path in sorted(self.folder.glob("rank*.json")):
            try:
                record = FailureRecord.from_json(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, TypeError):
                continue
            found[record.rank] = record
        return found

    def acknowledge(self, peer: int) -> None:
        """Tell ``peer`` that this rank read its record."""
        self.store.add(f"ack/{peer}", 1)

    def wait_for_acknowledgements(self, timeout: float = ACK_WAIT_S) -> bool:
        """Wait until every other rank read this rank's record, at most ``timeout`` seconds; whether they did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.store.add(f"ack/{self.rank}", 0) >= self.world_size - 1:
                    return True
            except Exception:
                return False
            time.sleep(0.05)
        return False


class FailureWatch:
    """A daemon thread that reads the board every ``POLL_S`` seconds and acts on each peer's new record.

    On a new record it acknowledges it, prints ``[rank R] rank r failed in <where>: <cause>`` to standard error, and,
    when a process group runs NCCL, aborts the groups: a collective blocked on the failed peer then returns at once
    (gloo needs no abort: the peer leaving the group breaks it).

    Args:
        board: The process group's board.
    """

    def __init__(self, board: FailureBoard) -> None:
        self.board = board
        self.seen: dict[int, FailureRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lightning_grpo-rank-failures", daemon=True)

    def start(self) -> FailureWatch:
        """Start watching; returns itself."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (returns at once; the thread ends within ``POLL_S``)."""
        self._stop.set()

    def peers(self) -> dict[int, FailureRecord]:
        """The other ranks' records read so far."""
        with self._lock:
            return dict(self.seen)

    def _run(self) -> None:
        read = 0
        while not self._stop.wait(POLL_S):
            try:
                posted = self.board.count()
                if posted > read:
                    read = posted
                    self._take(self.board.records())
            except Exception:  # the store's host left: nothing more to read here
                return

    def _take(self, records: dict[int, FailureRecord]) -> None:
        fresh = {r: rec for r, rec in records.items() if r != self.board.rank and r not in self.seen}
        with self._lock:
            self.seen.update(fresh)
        for peer, record in fresh.items():
            self.board.acknowledge(peer)
            print(f"[rank {self.board.rank}] rank {peer} failed in {record.where}: {record.cause}", file=sys.stderr)
        if fresh and not self._stop.is_set():
            abort_nccl_groups()


def abort_nccl_groups() -> bool:
    """Abort every process group when one runs NCCL (its blocked collectives return); whether it did."""
    groups = list(dist.distributed_c10d._world.pg_names)
    if not any("nccl" in str(dist.get_backend(group)) for group in groups):
        return False
    for group in groups:
        with contextlib.suppress(Exception):  # a group already aborted or destroyed
            group.abort()
    return True


def leave_process_group() -> None:
    """This rank leaves the process group: gloo peers' pending collectives with it fail at once."""
    if dist.is_available() and dist.is_initialized():
        abort_nccl_groups()
        dist.destroy_process_group()
