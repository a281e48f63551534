"""Advantage estimators declare what they need (``declare_needs``), never by name: a user's own estimator, named by its
import path, receives step rewards when it declares ``needs_step_rewards`` (docs/math.md, "Process supervision")."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig
from lightning_grpo.algorithms import EstimatorNeeds, declare_needs, estimator_needs
from lightning_grpo.config import AdvantageConfig, SamplingConfig
from lightning_grpo.rewards import StepRewards, step_reward
from tests.conftest import count_a, make_trainer, prompt_loader

RECEIVED: list[torch.Tensor | None] = []


@declare_needs(groups=True, step_rewards=True)
def step_sum_estimator(stats, completion_mask, settings):
    """Each token's advantage: the sum of the raw step rewards ending at or after it (no normalisation)."""
    RECEIVED.append(settings.step_rewards)
    steps = settings.step_rewards.nan_to_num(0.0)  # (N, T)
    return steps.flip(-1).cumsum(-1).flip(-1) * completion_mask


def undeclared_estimator(stats, completion_mask, settings):
    """Declares nothing: receives no step rewards, and a group of one is allowed."""
    RECEIVED.append(settings.step_rewards)
    return stats.rewards - stats.mean


@step_reward
def first_character_step(completions, **_):
    """One step per non-empty completion, ending after its first character, worth 1."""
    return [StepRewards([1.0], [1]) if c else None for c in completions]


PATH = f"{__name__}.step_sum_estimator"


class Keep(Callback):
    def __init__(self):
        self.outputs = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.outputs.append(outputs)


def test_the_built_in_estimators_declare_their_needs():
    assert estimator_needs("grpo") == EstimatorNeeds(groups=True, step_rewards=False)
    assert estimator_needs("grpo_process") == EstimatorNeeds(groups=True, step_rewards=True)
    assert estimator_needs(PATH) == EstimatorNeeds(groups=True, step_rewards=True)
    assert estimator_needs(undeclared_estimator) == EstimatorNeeds()


def test_a_users_estimator_that_declares_step_rewards_receives_them(make_module):
    RECEIVED.clear()
    module = make_module([first_character_step, count_a], advantages=AdvantageConfig(advantage_estimator=PATH))
    keep = Keep()
    make_trainer(max_steps=1, callbacks=[keep]).fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))
    (steps,) = RECEIVED
    out = keep.outputs[0]
    assert steps is not None and steps.shape == out["rollout"].completion_ids.shape
    torch.testing.assert_close(steps, out["rewards"].step_rewards, equal_nan=True)
    assert torch.nansum(steps) > 0  # the function's steps arrived
    assert out["advantages"].shape == steps.shape


def test_an_undeclared_users_estimator_receives_no_step_rewards(make_module):
    RECEIVED.clear()
    estimator = AdvantageConfig(advantage_estimator=f"{__name__}.undeclared_estimator")
    module = make_module([first_character_step, count_a], advantages=estimator)
    make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1="]))
    assert RECEIVED == [None]


def test_a_declared_need_is_checked_like_a_built_in_ones(make_module):
    with pytest.raises(ValueError, match="num_generations >= 2"):
        GRPOConfig(advantages=AdvantageConfig(advantage_estimator=PATH), sampling=SamplingConfig(num_generations=1))
    with pytest.raises(ValueError, match=f"advantage_estimator='{PATH}', which reads step rewards"):
        GRPOConfig(advantages=AdvantageConfig(advantage_estimator=PATH, dynamic_sampling=True))
    GRPOConfig(
        advantages=AdvantageConfig(advantage_estimator=f"{__name__}.undeclared_estimator"),
        sampling=SamplingConfig(num_generations=1),
    )  # no group needed
    module = make_module([count_a], advantages=AdvantageConfig(advantage_estimator=PATH))
    with pytest.raises(ValueError, match="needs step rewards"):
        make_trainer(max_steps=1).fit(module, train_dataloaders=prompt_loader(["1+1="]))


def test_a_need_that_is_not_a_bool_is_refused_naming_the_estimator():
    def sloppy(stats, completion_mask, settings):
        return stats.rewards

    sloppy.needs_step_rewards = "yes"
    with pytest.raises(TypeError, match=r"sloppy sets needs_step_rewards='yes'; it must be True or False"):
        estimator_needs(sloppy)
