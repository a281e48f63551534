"""Multi-turn trajectories under DDP and FSDP2 on 2 ranks: ranks with different numbers of turns finish (FSDP2 keeps
the idle rank in the synchronised sampling calls), and a resumed run equals an uninterrupted one; under DDP the
rollouts keep the turn cache, its default."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_dist_ranks_with_different_turn_counts_finish_and_resume_exactly(request, strategy):
    workdir = request.getfixturevalue(f"{strategy}_run")  # a hang would have failed the launch at its timeout
    records = [json.loads((workdir / f"agents-rank{rank}.json").read_text()) for rank in (0, 1)]
    turns = [record["turns"] for record in records]
    kept = strategy == "ddp"  # the default: on under DDP; FSDP2's synchronised sampling is generate's
    assert [record["turn_cache"] for record in records] == [[kept, kept]] * 2
    assert len(turns[0]) == len(turns[1]) == 2  # 2 iterations (2 optimizer steps each) per rank
    assert {t for batch in turns[0] for t in batch} == {1}
    rank1 = [t for batch in turns[1] for t in batch]
    assert max(rank1) == 3 and min(rank1) >= 2  # 3 turns, unless the token budget ran out in the third
    straight, resumed = torch.load(workdir / "agents-straight.pt"), torch.load(workdir / "agents-resumed.pt")
    assert set(straight) == set(resumed) and len(straight) == 28
    assert max(float((straight[k] - resumed[k]).abs().max()) for k in straight) <= 1e-6
