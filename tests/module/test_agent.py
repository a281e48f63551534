"""GRPOModule(agent=...): the user's own agent code as the rollout (docs/agents.md, "Your own agent code")."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.config import AgentConfig, SamplingConfig, UpdateConfig, ValidationConfig
from lightning_grpo.rollout import agent_client
from lightning_grpo.testing.agents import add, short_turn_model
from tests.conftest import make_trainer

BATCH = {"prompt": [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play"}]], "target": [1, 2]}


async def branching_agent(client, row):
    """Two calls; the second edits the first reply when ``target`` is 2 (so that row's runs have two sequences)."""
    first = await client.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=8)
    reply = first.choices[0].message.content or ""
    content = reply + "!" if row["target"] == 2 else reply
    messages = [*row["prompt"], {"role": "assistant", "content": content}, {"role": "user", "content": "more"}]
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    return float(len(second.choices[0].message.content or "") % 3)


def _module(tokenizer, agent=branching_agent, **groups):
    sampling = SamplingConfig(num_generations=2, max_new_tokens=40, max_prompt_length=64)
    return GRPOModule(short_turn_model(tokenizer), tokenizer=tokenizer, policy=PolicyConfig(lora_r=4, lora_alpha=8),
                      grpo=GRPOConfig(sampling=sampling, **groups), agent=agent)  # fmt: skip


def test_branches_share_their_trajectory_advantage_and_rewards_default_to_the_agents(tokenizer):
    module = _module(tokenizer)
    torch.manual_seed(0)
    rollout = module.generate(BATCH)
    assert len(rollout) == 2 * 1 + 2 * 2  # row 1: one sequence per run; row 2 (edited): two
    scores = module.score(rollout)
    assert scores.rewards.tolist() == [float(r) for r in rollout.columns["agent_reward"]]
    advantages = module.compute_advantages(scores.rewards, rollout)
    trajectory = rollout.columns["agent_trajectory"]
    for i, t in enumerate(trajectory):
        assert advantages[i] == advantages[trajectory.index(t) + trajectory.count(t) - 1]  # its last branch's
    last = torch.tensor(rollout.columns["agent_last"])  # one reward per trajectory: its last branch's
    cfg = module.config
    expected = compute_advantages(
        scores.rewards[last],
        rollout.group_ids[last],
        estimator=cfg.advantages.advantage_estimator,
        scale=cfg.advantages.advantage_scale,
        eps=cfg.advantages.advantage_eps,
    )
    torch.testing.assert_close(advantages[last], expected)
    per_run = agent_client.per_trajectory(scores.rewards, rollout, 4)  # what validation metrics read
    assert per_run.tolist() == scores.rewards[last].tolist()


def test_a_fit_with_variable_rows_per_step_trains_the_adapter(tokenizer):
    sizes = []

    class Rows(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            sizes.append(len(outputs["rollout"]))

    module = _module(tokenizer, update=UpdateConfig(mini_batch_size=4, micro_batch_size=2))
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    make_trainer(max_steps=2, callbacks=[Rows()]).fit(module, torch.utils.data.DataLoader([BATCH], batch_size=None))
    assert sizes == [6] and module.trainer.global_step == 2  # 6 rows: mini-batches of 4 and 2, one step each
    changed = {n for n, p in module.policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)


def test_validation_counts_one_reward_per_agent_run(tokenizer):
    module = _module(tokenizer, validation=ValidationConfig(num_generations=2))
    loader = torch.utils.data.DataLoader([BATCH], batch_size=None)
    (results,) = make_trainer(limit_val_batches=1).validate(module, loader)  # 6 rows, 4 runs
    assert 0.0 <= results["val/reward_mean"] <= 2.0 and "val/pass@2" in results


def test_a_raising_agent_does_not_crash_the_step(tokenizer):
    async def flaky(client, row):
        await client.chat.completions.create(model="policy", messages=row["prompt"])
        if row["target"] == 2:
            raise RuntimeError("tool server down")
        return 1.0

    module = _module(tokenizer, agent=flaky)
    make_trainer(max_steps=1).fit(module, torch.utils.data.DataLoader([BATCH], batch_size=None))
    assert module.trainer.callback_metrics["rollout/agent_failed"] == 2.0


def test_bad_agent_settings_are_refused(tokenizer):
    def not_async(client, row):
        return 1.0

    with pytest.raises(TypeError, match="coroutine function"):
        _module(tokenizer, agent=not_async)
    with pytest.raises(ValueError, match="cannot be combined with tools= or environment_factory="):
        GRPOModule(short_turn_model(tokenizer), tokenizer=tokenizer, agent=branching_agent, tools=[add])
    with pytest.raises(ValueError, match="agent_timeout"):
        GRPOConfig(agents=AgentConfig(agent_timeout=0))


@pytest.mark.parametrize("empty", [[], {}], ids=["list", "mapping"])
def test_empty_reward_funcs_leave_the_reward_to_the_agents(tokenizer, empty):
    """``reward_funcs=[]`` means none given, as a TRL-style environment's ``get_reward`` fills an empty list: each run
    is rewarded with what it returned (it was refused: "RewardFunctions needs at least one reward function")."""
    module = GRPOModule(
        short_turn_model(tokenizer),
        empty,
        tokenizer=tokenizer,
        agent=branching_agent,
        grpo=GRPOConfig(sampling=SamplingConfig(num_generations=2, max_new_tokens=40, max_prompt_length=64)),
    )
    torch.manual_seed(0)
    rollout = module.generate(BATCH)
    assert module.score(rollout).rewards.tolist() == [float(r) for r in rollout.columns["agent_reward"]]
