"""GRPOModule with ``advantage_estimator="grpo_process"``: step rewards from reward functions and environments become
per-token advantages, metrics are logged, and a run without step rewards is refused at fit start (docs/math.md)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.algorithms.process_supervision import process_advantages, with_outcome_step
from lightning_grpo.config import AdvantageConfig, AgentConfig, SamplingConfig
from lightning_grpo.iteration.zero_signal import NO_STEP_MESSAGE
from lightning_grpo.rewards import StepRewards, step_reward
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model
from tests.conftest import count_a, make_trainer, prompt_loader, tiny_sampling

# Worst of the 9 runs of the learning matrix (docs/benchmarks.md, "Process supervision"): 0.08 and 0.33.
PROCESS_TURN2_RISE = 0.04
OUTCOME_TURN2_RISE = 0.2


@step_reward
def halves(completions, **_):
    """Two steps per completion of two characters or more: its halves, each scored by its character codes."""
    score = lambda text: sum(map(ord, text)) % 5  # noqa: E731
    out = []
    for c in completions:
        middle = len(c) // 2
        out.append(StepRewards([score(c[:middle]), score(c[middle:])], [middle, len(c)]) if middle else None)
    return out


class Keep(Callback):
    def __init__(self):
        self.outputs = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.outputs.append(outputs)


def _fit(module, prompts, **batch):
    keep = Keep()
    trainer = make_trainer(max_steps=1, callbacks=[keep])
    loader = torch.utils.data.DataLoader([{"prompt": prompts, **batch}], batch_size=None) if batch else None
    loader = loader or prompt_loader(prompts)
    trainer.fit(module, train_dataloaders=loader)
    return keep.outputs[0], trainer


def test_function_steps_become_token_advantages(make_module):
    advantages = AdvantageConfig(advantage_estimator="grpo_process", process_outcome_weight=0.5)
    module = make_module([halves, count_a], sampling=tiny_sampling(max_new_tokens=8), advantages=advantages)
    out, trainer = _fit(module, ["1+1=", "2+2="])
    rollout, scores = out["rollout"], out["rewards"]
    steps = scores.step_rewards
    assert steps.shape == rollout.completion_ids.shape and out["advantages"].shape == steps.shape
    for i, completion in enumerate(rollout.completions):
        ends = torch.nonzero(~torch.isnan(steps[i])).flatten().tolist()
        value = halves([completion])[0]
        last = int(rollout.completion_lengths[i]) - 1
        if value is None:  # only count_a's outcome step, at the last token (EOS or the budget's last)
            assert ends == [last]
            continue
        # The character tokenizer: character c - 1 is the c-th token that decodes to text (sampled special tokens
        # decode to nothing); a step ending at character c ends there. The outcome step ends at the last token.
        ids = rollout.completion_token_ids[i]
        visible = [k for k, t in enumerate(ids) if module.tokenizer.decode([t], skip_special_tokens=True)]
        assert ends == sorted({visible[e - 1] for e in value.ends} | {last})
        on_last = value.rewards[-1] if visible[value.ends[-1] - 1] == last else 0
        expected_last = 0.5 * count_a([""], [completion])[0] + on_last
        assert math.isclose(float(steps[i, last]), expected_last, rel_tol=1e-6)
    expected = process_advantages(steps, rollout.group_ids, rollout.sampled_mask)
    torch.testing.assert_close(out["advantages"], expected)
    assert out["advantages"].abs().sum() > 0
    for name in ("process/steps_mean", "process/step_reward_mean", "process/no_step_frac"):
        assert torch.isfinite(trainer.callback_metrics[f"train/{name}"])


def test_environment_turns_are_the_steps(tokenizer):
    def env_score(env_reward, **_):
        return [float(r) for r in env_reward]

    module = GRPOModule(
        short_turn_model(tokenizer),
        [env_score],
        tokenizer=tokenizer,
        environment_factory=CountdownEnv,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(
            sampling=SamplingConfig(num_generations=2, max_new_tokens=60, max_prompt_length=32),
            agents=AgentConfig(max_turns=3),
            advantages=AdvantageConfig(advantage_estimator="grpo_process"),
        ),
    )
    prompts = [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play"}]]
    out, trainer = _fit(module, prompts, turns=[2, 3])
    rollout, steps = out["rollout"], out["rewards"].step_rewards
    for i in range(len(rollout)):  # one step per judged turn, at its last sampled token, with the turn's reward
        ends = torch.nonzero(~torch.isnan(steps[i])).flatten().tolist()
        assert ends == rollout.turns.turn_ends[i]
        assert steps[i, ends].tolist() == rollout.turns.turn_rewards[i]
    advantages = out["advantages"]
    torch.testing.assert_close(advantages, process_advantages(steps, rollout.group_ids, rollout.sampled_mask))
    assert (advantages[rollout.sampled_mask == 0] == 0).all()  # environment tokens: no advantage
    assert float(trainer.callback_metrics["train/process/steps_mean"]) == pytest.approx(2.5)  # turns 2, 2, 3, 3


def test_outcome_weight_adds_the_outcome_as_a_last_step(make_module):
    module = make_module(
        [halves, count_a], advantages=AdvantageConfig(advantage_estimator="grpo_process", process_outcome_weight=2.0)
    )
    rollout = module.generate({"prompt": ["1+1=", "2+2="]})
    scores = module.score(rollout)
    steps_alone = make_module([halves, count_a], advantages=AdvantageConfig(advantage_estimator="grpo_process"))
    alone = steps_alone.score(rollout).step_rewards
    outcome = 2.0 * torch.tensor(count_a(None, rollout.completions))  # halves' totals are not outcome rewards
    torch.testing.assert_close(scores.step_rewards, with_outcome_step(alone, outcome, rollout.completion_mask, 1.0),
                               equal_nan=True)  # fmt: skip


def test_zero_signal_is_judged_on_step_rewards(make_module):
    @step_reward
    def none(completions, **_):
        return [None] * len(completions)

    module = make_module([count_a, none], advantages=AdvantageConfig(advantage_estimator="grpo_process"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, trainer = _fit(module, ["1+1=", "2+2="])
    messages = [str(w.message) for w in caught]
    assert NO_STEP_MESSAGE.format(step=0) in messages  # count_a scores every row, but no row has a step
    assert float(trainer.callback_metrics["train/zero_std_frac"]) == 1.0
    assert float(trainer.callback_metrics["train/process/no_step_frac"]) == 1.0


def test_grpo_process_without_step_rewards_is_refused_at_fit_start(make_module):
    module = make_module([count_a], advantages=AdvantageConfig(advantage_estimator="grpo_process"))
    with pytest.raises(ValueError, match=r"needs step rewards.*count_a.*@lightning_grpo.rewards.step_reward"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1="]))


def test_grpo_process_refuses_dynamic_sampling():
    with pytest.raises(
        ValueError, match=r"dynamic_sampling .* cannot be combined with advantage_estimator='grpo_process'"
    ):
        GRPOConfig(advantages=AdvantageConfig(advantage_estimator="grpo_process", dynamic_sampling=True))
    with pytest.raises(ValueError, match="process_outcome_weight"):
        GRPOConfig(advantages=AdvantageConfig(process_outcome_weight=math.inf))


@pytest.mark.learning
def test_process_supervision_learns_the_second_turn():
    """What holds on every run of ``python -m benchmarks.learning --cases process_supervision`` (3 seeds x 3 CPU
    instruction sets; docs/benchmarks.md, "Process supervision"): with ``grpo_process`` the second turn learns to use
    the first. Whether it beats outcome supervision is not asserted: it does not on every run (the table says so)."""
    from benchmarks.process_supervision import compare_arms

    figures = compare_arms(seed=0)
    assert figures["process_turn2_rise"] >= PROCESS_TURN2_RISE
    assert figures["outcome_turn2_rise"] >= OUTCOME_TURN2_RISE
