"""One rank of the vote run (torch only, no model): ``python -m tests.distributed.votes_worker WORKDIR``.

Each scenario drives :func:`~lightning_grpo.rollout.rank_agreement.agreed_rollout` on 2 gloo ranks the way FSDP2's turn
loop does: before each turn every rank asks :meth:`RankVotes.any_active`, and rank 1 fails in a turn's tool or
environment step. Every rank writes ``votes-rankR.json``: per scenario, what it returned or raised.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_grpo.rollout.rank_agreement import RankFailureError, RankVotes, agreed_rollout
from tests.distributed.ranks import rank, write_json

TURNS = 3


def _sum(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor)
    return tensor


def turn_loop(fail_at: int | None, votes: RankVotes) -> list[int]:
    """Turns that ask every rank whether any still runs; a failure (rank 1) in the step of turn ``fail_at``."""
    done = []
    for turn in range(TURNS):
        if not votes.any_active(True):
            break
        if fail_at == turn:
            raise RuntimeError(f"tool failed in turn {turn} on rank {rank()}")
        done.append(turn)
    return done


SCENARIOS: dict[str, Any] = {
    "first-turn": lambda votes: turn_loop(0 if rank() == 1 else None, votes),  # rank 0 asks again: the failure answers
    "last-turn": lambda votes: turn_loop(TURNS - 1 if rank() == 1 else None, votes),  # rank 0 goes to the agreement
    "both-fail": lambda votes: turn_loop(1, votes),
    "fine": lambda votes: turn_loop(None, votes),
    "all-empty": lambda votes: [],
}


def main(argv: list[str]) -> None:
    (workdir,) = argv
    dist.init_process_group("gloo", rank=rank(), world_size=2, timeout=timedelta(seconds=60))
    votes = RankVotes.of(_sum, torch.device("cpu"), rank(), 2)
    results = {}
    try:
        for name, sample in SCENARIOS.items():
            try:
                result = agreed_rollout(lambda s=sample: s(votes), votes, is_empty=lambda turns: not turns)
                results[name] = {"returned": result}
            except RankFailureError as error:
                cause = error.__cause__
                results[name] = {
                    "message": str(error),
                    "causes": {str(k): v for k, v in error.causes.items()},
                    "own": None if cause is None else str(cause),
                }
        dist.barrier()  # no collective was left unpaired: the ranks are still in step
    finally:
        dist.destroy_process_group()
    write_json(Path(workdir) / f"votes-rank{rank()}.json", results)


if __name__ == "__main__":
    main(sys.argv[1:])
