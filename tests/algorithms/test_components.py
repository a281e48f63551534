"""Components with settings of their own: built-ins and user functions or classes by one route, and the errors."""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor

from lightning_grpo import GRPOConfig
from lightning_grpo.algorithms import PolicyLossSettings, PolicyLossTerms, compute_advantages, kl_penalty, policy_loss
from lightning_grpo.algorithms.components import component_settings
from lightning_grpo.algorithms.policy_losses import POLICY_LOSS
from lightning_grpo.config import GROUPS, ObjectiveConfig

HERE = __name__  # this module: its functions and classes are the user's components of the tests
LP = torch.tensor([[0.0, -1.0], [-0.5, -0.2]])
OLD = torch.tensor([[-0.5, -1.0], [0.0, -0.2]])
MASK = torch.ones(2, 2)
ADV = torch.tensor([1.0, -1.0])


def capped_reinforce(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, settings: PolicyLossSettings,
    *, max_ratio: float = 5.0,
) -> PolicyLossTerms:  # fmt: skip
    ratio = torch.exp(logprobs - old_logprobs)
    return PolicyLossTerms(loss=-advantages * ratio.clamp(max=max_ratio), ratio=ratio)


class TemperedLoss:
    """A class component (SAPO's shape): two settings in ``__init__``, state on the instance."""

    def __init__(self, temperature_pos: float = 1.0, temperature_neg: float = 1.05) -> None:
        self.temperature_pos, self.temperature_neg, self.calls = temperature_pos, temperature_neg, 0

    def __call__(self, logprobs, old_logprobs, advantages, mask, settings) -> PolicyLossTerms:
        self.calls += 1
        ratio = torch.exp(logprobs - old_logprobs)
        tau = torch.where(advantages > 0, self.temperature_pos, self.temperature_neg)
        return PolicyLossTerms(loss=-advantages * torch.sigmoid(tau * (ratio - 1)) * 4 / tau, ratio=ratio)


def scaled_k2(d: Tensor, *, scale: float) -> Tensor:
    return scale * 0.5 * d.square()


def shifted(stats, completion_mask, settings, *, shift: float = 0.0) -> Tensor:
    return stats.rewards - stats.mean + shift


def not_a_loss(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    return logprobs


def test_a_user_loss_gets_its_own_setting_from_python_and_the_config():
    loss, _ = policy_loss(LP, OLD, ADV, MASK, kind=f"{HERE}.capped_reinforce", kind_args={"max_ratio": 1.1})
    ratio = torch.exp(LP - OLD)
    torch.testing.assert_close(loss, -ADV[:, None] * ratio.clamp(max=1.1))
    config = GRPOConfig(
        objective=ObjectiveConfig(loss_kind=f"{HERE}.capped_reinforce", loss_kind_args={"max_ratio": 1.1})
    )
    assert config.component("loss_kind").keywords == {"max_ratio": 1.1}
    assert config.objective.loss_kind_args == {"max_ratio": 1.1}  # plain data, as given, for hyperparameters


def test_the_clip_loss_takes_its_clip_settings_as_its_own_and_the_flat_fields_still_work():
    by_args, stats_args = policy_loss(LP, OLD, ADV, MASK, kind="clip", kind_args={"clip_high": 0.1, "dual_clip": None})
    by_flat, stats_flat = policy_loss(LP, OLD, ADV, MASK, kind="clip", clip_high=0.1, dual_clip=None)
    torch.testing.assert_close(by_args, by_flat)
    torch.testing.assert_close(stats_args.clip_frac_high, stats_flat.clip_frac_high)  # stats read the same bounds
    assert stats_args.clip_frac_high > 0  # ratio e^0.5 > 1.1 on a positive advantage
    config = GRPOConfig(objective=ObjectiveConfig(loss_kind_args={"clip_high": 0.28}))
    assert (
        config.objective.policy_loss_settings().clip_high == 0.28 and config.objective.clip_high == 0.2
    )  # args win over the field
    assert config.component("loss_kind").keywords["clip_high"] == 0.28
    assert (
        GRPOConfig(objective=ObjectiveConfig(clip_high=0.28)).component("loss_kind").keywords["clip_high"] == 0.28
    )  # flat field: the default


def test_a_class_component_is_built_once_with_its_settings_and_keeps_its_state():
    config = GRPOConfig(
        objective=ObjectiveConfig(loss_kind=f"{HERE}.TemperedLoss", loss_kind_args={"temperature_neg": 2.0})
    )
    loss = config.component("loss_kind")
    assert isinstance(loss, TemperedLoss) and (loss.temperature_pos, loss.temperature_neg) == (1.0, 2.0)
    policy_loss(LP, OLD, ADV, MASK, kind=config.objective.loss_kind, kind_args=config.objective.loss_kind_args)
    policy_loss(LP, OLD, ADV, MASK, kind=config.objective.loss_kind, kind_args=config.objective.loss_kind_args)
    assert loss.calls == 2  # the same instance served both calls
    assert component_settings(TemperedLoss, POLICY_LOSS) == {"temperature_pos": 1.0, "temperature_neg": 1.05}


def test_estimators_take_their_own_settings():
    lp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    got = kl_penalty(lp, ref, f"{HERE}.scaled_k2", {"scale": 3.0})
    torch.testing.assert_close(got, 1.5 * (ref - lp).square())
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    shifted_adv = compute_advantages(rewards, groups, estimator=f"{HERE}.shifted", estimator_args={"shift": 0.5})
    torch.testing.assert_close(shifted_adv, torch.tensor([1.0, 0.0, 0.0, 0.0]))  # constant group 1 stays 0
    config = GRPOConfig(objective=ObjectiveConfig(kl_estimator=f"{HERE}.scaled_k2", kl_estimator_args={"scale": 2.0}))
    assert config.component("kl_estimator").keywords == {"scale": 2.0}


@pytest.mark.parametrize(
    ("group", "settings", "message"),
    [
        (
            "objective",
            {"loss_kind_args": {"beta": 1.0}},
            "loss_kind_args={'beta': 1.0} is not valid: the policy loss kind 'clip' takes no setting 'beta'; "
            "its settings: clip_low, clip_high, dual_clip, delta",
        ),
        (
            "objective",
            {"loss_kind": "cispo", "loss_kind_args": {"dual_clip": 2.0}},
            "takes no setting 'dual_clip'; its settings: clip_low, clip_high",
        ),
        ("objective", {"kl_estimator_args": {"scale": 2.0}}, "the KL estimator 'k3' takes no settings; got 'scale'"),
        (
            "advantages",
            {"advantage_estimator_args": {"shift": 1}},
            "the advantage estimator 'grpo' takes no settings; got 'shift'",
        ),
        (
            "objective",
            {"loss_kind": f"{HERE}.capped_reinforce", "loss_kind_args": {"max_ration": 2}},
            "takes no setting 'max_ration'; its settings: max_ratio",
        ),
        ("objective", {"kl_estimator": f"{HERE}.scaled_k2"}, "needs the setting(s) scale"),
        (
            "objective",
            {"loss_kind": f"{HERE}.not_a_loss"},
            "is not one: a policy loss is called as f(logprobs, old_logprobs, advantages, completion_mask, settings) "
            "-> PolicyLossTerms, but it takes (logprobs: 'Tensor', old_logprobs: 'Tensor')",
        ),
        (
            "objective",
            {"loss_kind": f"{HERE}.no_such_loss"},
            f"cannot import the policy loss kind '{HERE}.no_such_loss'",
        ),
        ("objective", {"loss_kind": "ppo"}, "loss_kind='ppo' is not valid; choose one of 'clip', 'gspo', 'cispo'"),
        ("objective", {"loss_kind_args": ["clip_high"]}, "loss_kind_args must be a mapping of setting names to values"),
        (
            "objective",
            {"loss_kind_args": {"clip_high": -0.1}},
            "GRPOConfig.objective.loss_kind_args.clip_high must be a finite number >= 0",
        ),
    ],
    ids=[
        "unknown",
        "builtin-other",
        "kl-none",
        "adv-none",
        "user-typo",
        "missing",
        "signature",
        "import",
        "name",
        "not-a-mapping",
        "range",
    ],
)
def test_bad_component_settings_are_refused_naming_what_is_allowed(group, settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GRPOConfig(**{group: GROUPS[group](**settings)})
