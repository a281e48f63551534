"""The ranks agree on each rollout's outcome before their next collective, so that none waits on a peer that failed.

Under DDP every rank samples its own rollout, with no collective inside it. When one rank's rollout raises (its
agent code, an environment's ``step``, a tool server that died), that rank would leave while the others block in
their next collective: gloo reports "Connection closed by peer", which names nothing, and NCCL waits until the
process group's timeout (``GRPOConfig.faults.collective_timeout_s``). :func:`agreed_rollout` runs the rollout in a guard
and then takes one small collective on every rank, a sum of ``(active, failed, empty)`` votes; when a rank failed, the
causes are gathered and every rank raises a :class:`RankFailureError` naming each failing rank and its cause (on a
failing rank it is chained to the rank's own exception). One process pays a ``try`` and nothing else.

Under FSDP2 the turn loop samples in step (``synced_gpus``) and asks, before each turn, whether any rank still runs
a trajectory (:meth:`RankVotes.any_active`): that question is the same vote, so a rank that failed in a turn's tool
calls or environment steps answers the others' next question with its failure and no collective is left unpaired.
A rank that fails inside a sampling call (whose forward holds FSDP2's own collectives) cannot vote: its vote would
pair with the others' all-gather. :class:`InStepSession` marks such an error, :func:`agreed_rollout` lets it pass
unvoted, and it reaches the other ranks out of band (:class:`~lightning_grpo.callbacks.RankFailureWatch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["InStepSession", "RankFailureError", "RankVotes", "agreed_rollout"]

T = TypeVar("T")
_ACTIVE, _FAILED, _EMPTY = 0, 1, 2
#: Longest cause (exception type and message) a rank sends to the others, in characters.
CAUSE_CHARS = 2000
#: The attribute that marks an error raised while the other ranks may wait in a collective of the same call.
_INSIDE_COLLECTIVES = "_lightning_grpo_inside_collectives"


class RankFailureError(RuntimeError):
    """The rollout failed on one or more ranks: raised on every rank, naming each failing rank and its cause.

    Attributes:
        causes: Failing rank to its cause, ``"ExceptionType: message"``.
    """

    def __init__(self, message: str, causes: dict[int, str]) -> None:
        super().__init__(message)
        self.causes = causes


class _PeerFailed(Exception):
    """Another rank's failure answered this rank's turn-loop vote (:meth:`RankVotes.any_active`)."""


@dataclass(frozen=True)
class RankVotes:
    """The rollout's collectives on several processes: the turn loop's question and the agreement after the rollout.

    Args:
        sum_across_ranks: Sums a tensor over the ranks (the strategy's all-reduce).
        device: Where the vote tensors are made (the module's device: NCCL needs CUDA tensors).
        rank: This process's rank.
        world_size: Number of processes.
    """

    sum_across_ranks: Callable[[Tensor], Tensor]
    device: torch.device
    rank: int
    world_size: int

    @classmethod
    def of(
        cls, sum_across_ranks: Callable[[Tensor], Tensor], device: torch.device, rank: int, world_size: int
    ) -> RankVotes | None:
        """The votes of a run of ``world_size`` processes; ``None`` for one process (nothing to agree on)."""
        return cls(sum_across_ranks, device, rank, world_size) if world_size > 1 else None

    def any_active(self, active: bool) -> bool:
        """Whether any rank still runs a trajectory (a collective; FSDP2's turn loop asks it before every turn).

        Raises:
            _PeerFailed: Another rank's rollout failed; :func:`agreed_rollout` turns it into the agreed error.
        """
        totals = self._vote(active=active)
        if totals[_FAILED]:
            raise _PeerFailed
        return bool(totals[_ACTIVE])

    def _vote(self, *, active: bool = False, failed: bool = False, empty: bool = False) -> list[float]:
        """The ranks' sums of the three votes (one all-reduce of three float64 values)."""
        votes = torch.tensor([float(active), float(failed), float(empty)], dtype=torch.float64, device=self.device)
        return self.sum_across_ranks(votes).tolist()

    def causes(self, error: BaseException | None) -> dict[int, str]:
        """Every failing rank's cause, gathered from all ranks (a collective: after a failed vote only)."""
        mine = None if error is None else f"{type(error).__name__}: {error}"[:CAUSE_CHARS]
        gathered: list[str | None] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, mine)
        return {rank: cause for rank, cause in enumerate(gathered) if cause is not None}


class InStepSession:
    """A sampling session whose calls every rank joins together (FSDP2): an error raised inside one is marked, so that
    :func:`agreed_rollout` does not vote on it (the others wait in the call's collectives, not in a vote).

    Args:
        session: The backend's session (anything with ``sample(model, tokenizer, request)``).
    """

    def __init__(self, session: Any) -> None:
        self.session = session

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        """The session's ``sample``; an error it raises leaves marked."""
        try:
            return self.session.sample(*args, **kwargs)
        except Exception as error:
            setattr(error, _INSIDE_COLLECTIVES, True)
            raise

    def close(self) -> None:
        """The session's ``close``."""
        self.session.close()


def agreed_rollout(
    sample: Callable[[], T], ranks: RankVotes | None, *, is_empty: Callable[[T], bool] = lambda _: False
) -> T:
    """``sample()`` on every rank, then one vote: the result if no rank failed, else the same error on every rank.

    Args:
        sample: This rank's rollout.
        ranks: The votes of several processes; ``None`` on one process (``sample()`` is returned as it is).
        is_empty: Whether a result holds no rows (a rank whose agents made no chat call): it takes part in the step,
            unless every rank is empty.

    Returns:
        ``sample()``'s result.

    Raises:
        RankFailureError: ``sample()`` raised on some rank (on that rank, chained to its exception), or every rank's
            result is empty.
    """
    if ranks is None:
        return sample()
    try:
        result = sample()
    except _PeerFailed:  # a peer's failure answered this rank's turn-loop vote: that was this rollout's vote
        causes = ranks.causes(None)
        raise RankFailureError(_message(causes, ranks), causes) from None
    except Exception as error:  # any failure of this rank's rollout: every rank learns of it in the vote
        if getattr(error, _INSIDE_COLLECTIVES, False):
            raise  # the others wait inside the same sampling call: they learn of it out of band
        ranks._vote(failed=True)
        causes = ranks.causes(error)
        raise RankFailureError(_message(causes, ranks), causes) from error
    _, failed, empty = ranks._vote(empty=is_empty(result))
    if failed:
        causes = ranks.causes(None)
        raise RankFailureError(_message(causes, ranks), causes)
    if empty == ranks.world_size:
        raise RankFailureError(
            f"the rollout is empty on every one of the {ranks.world_size} ranks (no agent execution made a chat "
            "call), so there is nothing to train on",
            {},
        )
    return result


def _message(causes: dict[int, str], ranks: RankVotes) -> str:
    """The error every rank raises: each failing rank and its cause, and which rank this is."""
    failing = sorted(causes)
    which = f"rank {failing[0]}" if len(failing) == 1 else "ranks " + ", ".join(str(rank) for rank in failing)
    lines = "\n".join(f"  rank {rank}: {causes[rank]}" for rank in failing)
    return (
        f"the rollout failed on {which} of {ranks.world_size}, so every rank stops here (this is rank "
        f"{ranks.rank}):\n{lines}"
    )
