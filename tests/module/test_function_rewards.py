"""GRPOModule with an estimator that reads each reward function's rewards (``gdpo``), and the estimators' own
settings (``advantage_estimator_args``) on every route, ``agent=`` included."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.config import AdvantageConfig, SamplingConfig
from lightning_grpo.iteration.function_rewards import function_reward_inputs
from lightning_grpo.testing import build_tiny_model
from lightning_grpo.testing.agents import short_turn_model
from tests.conftest import count_a, make_trainer, prompt_loader, tiny_sampling
from tests.module.helpers import FixedRolloutModule, fixed_rollout
from tests.module.test_agent import BATCH, _module, branching_agent

PROMPTS = ["1+1="] * 4 + ["2+5="] * 4
COMPLETIONS = ["2", "aa", "3", "a b c", "7", "aaaa", "77", "ab"]


def short(completions: list[str], **_: object) -> list[float]:
    """1 for completions of at most two characters."""
    return [float(len(c) <= 2) for c in completions]


def skip_second_prompt(prompts: list[str], completions: list[str], **_: object) -> list[float | None]:
    """None for every completion of the second prompt (a whole group), else the length."""
    return [None if p == "2+5=" else float(len(c)) for p, c in zip(prompts, completions, strict=True)]


class Record(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs = outputs


def test_gdpo_step_gets_each_functions_rewards_and_logs_their_shares(tokenizer):
    weights = [1.0, 0.5, 2.0]
    module = FixedRolloutModule(
        build_tiny_model(tokenizer), [count_a, short, skip_second_prompt], reward_weights=weights, tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling=tiny_sampling(), advantages=AdvantageConfig(advantage_estimator="gdpo")),
    )  # fmt: skip
    module.fixed = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    record = Record()
    trainer = make_trainer(max_steps=1, callbacks=[record])
    trainer.fit(module, train_dataloaders=prompt_loader(PROMPTS[::4]))
    scores = record.outputs["rewards"]
    assert math.isnan(float(scores.per_function["skip_second_prompt"][4]))
    expected = compute_advantages(
        scores.rewards, module.fixed.group_ids, estimator="gdpo", function_rewards=scores.per_function,
        function_weights=dict(zip(module.rewards.names, weights, strict=True)),
    )  # fmt: skip
    torch.testing.assert_close(record.outputs["advantages"], expected)
    grpo = compute_advantages(scores.rewards, module.fixed.group_ids)
    assert not torch.allclose(expected, grpo)  # the per-function route, not the weighted sum's
    metrics = trainer.callback_metrics
    shares = [float(metrics[f"train/gdpo/{name}/share"]) for name in module.rewards.names]
    assert sum(shares) == pytest.approx(1.0)
    assert all(0 < s < 1 for s in shares)
    assert float(metrics["train/gdpo/short/zero_std_frac"]) == 0.0  # short varies in both groups
    assert float(metrics["train/gdpo/skip_second_prompt/zero_std_frac"]) == 0.0  # scored one group, which varies


def test_gdpo_with_one_reward_function_is_refused_at_construction(make_module):
    with pytest.raises(ValueError, match=r"advantage_estimator='gdpo'.*two reward functions or more.*'count_a'"):
        make_module([count_a], advantages=AdvantageConfig(advantage_estimator="gdpo"))


def test_gdpo_with_an_agents_own_reward_is_refused_at_construction(tokenizer):
    async def agent(client, row):
        return 1.0

    with pytest.raises(ValueError, match=r"agent= run has one reward \(\['agent_reward'\]; without reward_funcs"):
        _module(tokenizer, agent=agent, advantages=AdvantageConfig(advantage_estimator="gdpo"))


def test_agent_rollouts_keep_the_estimators_settings(tokenizer):
    # gpg's f_norm divides every advantage: f_norm=4 gives a quarter of f_norm=1 (the agent branch once dropped
    # advantage_estimator_args)
    module = _module(
        tokenizer, advantages=AdvantageConfig(advantage_estimator="gpg", advantage_estimator_args={"f_norm": 4.0})
    )
    torch.manual_seed(0)
    rollout = module.generate(BATCH)
    scores = module.score(rollout)
    quartered = module.compute_advantages(scores.rewards, rollout)
    module.config.advantages.advantage_estimator_args = None
    plain = module.compute_advantages(scores.rewards, rollout)
    assert bool(plain.abs().sum() > 0)
    torch.testing.assert_close(quartered, plain / 4)


def test_gdpo_on_agent_trajectories_scored_by_two_functions(tokenizer):
    # Each trajectory's last branch carries its rewards; the other branches are left out and take its advantage.
    def length(completions, **_):
        return [float(len(str(c)) % 5) for c in completions]

    def vowels(completions, **_):
        return [float(sum(ch in "aeiou" for ch in str(c)) % 3) for c in completions]

    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=2, max_new_tokens=40, max_prompt_length=64),
        advantages=AdvantageConfig(advantage_estimator="gdpo"),
    )
    module = GRPOModule(short_turn_model(tokenizer), [length, vowels], tokenizer=tokenizer,
                        policy=PolicyConfig(lora_r=4, lora_alpha=8), grpo=grpo, agent=branching_agent)  # fmt: skip
    torch.manual_seed(0)
    rollout = module.generate(BATCH)
    scores = module.score(rollout)
    advantages = module.compute_advantages(
        scores.rewards, rollout, **function_reward_inputs(module.config, scores, module.rewards)
    )
    last = torch.tensor(rollout.columns["agent_last"])
    expected = compute_advantages(
        scores.rewards[last], rollout.group_ids[last], estimator="gdpo",
        function_rewards={k: v[last] for k, v in scores.per_function.items()},
    )  # fmt: skip
    torch.testing.assert_close(advantages[last], expected)
    assert bool(expected.abs().sum() > 0)
    trajectory = rollout.columns["agent_trajectory"]
    for i, t in enumerate(trajectory):
        assert advantages[i] == advantages[trajectory.index(t) + trajectory.count(t) - 1]
