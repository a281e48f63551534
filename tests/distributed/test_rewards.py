"""A reward model and dynamic sampling under DDP and FSDP2 on 2 ranks: ranks needing different numbers of sampling
rounds run the same number (none waits forever), metrics are global, no prompt is drawn twice, and the reward model
is a full unsharded copy on every rank, outside the optimizer, scoring as it does in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_grpo.rewards import RewardModel
from lightning_grpo.testing import build_tiny_tokenizer
from tests.distributed.builders import G
from tests.distributed.launch import run_ranks
from tests.distributed.rewards_scenario import NUM_PROMPTS, classifier, has_signal

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def ranks(request, tmp_path_factory) -> list[dict]:
    workdir = tmp_path_factory.mktemp(f"rewards-{request.param}")
    run_ranks([request.param, str(workdir), "rewards"], workdir, timeout=300)  # a hang fails here
    return [json.loads((Path(workdir) / f"rewards-rank{r}.json").read_text()) for r in (0, 1)]


def _groups(prompts: list[str]) -> list[str]:
    return prompts[::G]


def test_dist_every_step_trains_on_informative_groups_with_the_same_rounds_on_every_rank(ranks):
    assert len(ranks[0]["steps"]) == len(ranks[1]["steps"]) == 2
    for step0, step1 in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        m0, m1 = step0["metrics"], step1["metrics"]
        assert m0["train/sampling_rounds"] == m1["train/sampling_rounds"] >= 1
        for name in ("train/prompts_per_iteration", "train/filtered_groups_frac", "train/zero_std_frac"):
            assert m0[name] == m1[name]  # global statistics: the same on both ranks
        assert m0["train/prompts_per_iteration"] == 2 * 2 * m0["train/sampling_rounds"]  # 2 prompts/round on 2 ranks
        for step in (step0, step1):
            assert all(has_signal(int(p[:2])) for p in _groups(step["prompts"]))  # only informative groups kept
        assert m0["train/informative_groups_frac"] == 1.0 and m0["train/zero_std_frac"] == 0.0
    # rank 1 (1 in 5 prompts informative) needs more rounds than rank 0 (1 in 3): both ran rank 1's count
    assert len(ranks[1]["scored"]) == len(ranks[0]["scored"]) > 2 * 2


def test_dist_extra_prompts_come_from_the_sampler_without_repeats(ranks):
    scored = [ranks[0]["scored"], ranks[1]["scored"]]
    everything = scored[0] + scored[1]
    assert len(everything) == len(set(everything)) <= NUM_PROMPTS  # no prompt drawn twice, on any rank
    assert not set(scored[0]) & set(scored[1])  # the ranks' shards of the same sampler order
    total = sum(s["metrics"]["train/prompts_per_iteration"] for s in ranks[0]["steps"])
    assert total == len(everything)  # the logged count is exact


def test_dist_reward_model_is_a_full_copy_outside_the_optimizer_scoring_like_one_process(ranks):
    reference = RewardModel(classifier(), build_tiny_tokenizer(), name="tiny-rm")
    for result in ranks:
        assert result["rm_device"] == "cpu" and result["rm_dtype"] == "torch.float32"
        assert not result["rm_sharded"] and not result["rm_in_optimizer"] and not result["rm_requires_grad"]
        assert result["rm_numel"] == sum(p.numel() for p in reference.model.parameters())
        step = result["steps"][0]
        expected = reference(step["prompts"], step["completions"])
        assert step["rm_scores"] == pytest.approx(expected, abs=1e-4)
        assert len({round(s, 4) for s in expected}) > 1
    assert torch.isfinite(torch.tensor(ranks[0]["steps"][0]["rm_scores"])).all()
