"""``packing: auto`` is decided once per rollout by its padding (``rollout.packing.packing_for``): every log-prob
pass of a step (old, reference, current) takes the same path, and a rollout with no padding runs padded rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightning_grpo import GRPOModule
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from lightning_grpo.iteration import policy_logprobs
from lightning_grpo.rollout import packing
from tests.conftest import make_trainer, prompt_loader


class FixedLength(GRPOModule):
    """Every completion ``max_new_tokens`` long (EOS barred before): a rollout with no padding."""

    def sampling_settings(self, **kwargs):
        return replace(super().sampling_settings(**kwargs), min_new_tokens=self.config.sampling.max_new_tokens)


def _packings_of_one_step(make_module, monkeypatch, packing="auto", **settings) -> list:
    seen = []
    real = policy_logprobs.completion_logprobs

    def recording(model, rollout, **kwargs):
        seen.append(kwargs["packing"])
        return real(model, rollout, **kwargs)

    monkeypatch.setattr(policy_logprobs, "completion_logprobs", recording)
    module = make_module(
        **settings, objective=ObjectiveConfig(kl_coef=0.1), update=UpdateConfig(ppo_epochs=2, packing=packing)
    )  # old, reference and current log-probs
    make_trainer(max_steps=2).fit(module, prompt_loader(["1+1=", "2+2="]))
    assert module._packing is None  # the decision does not outlive its step
    return seen


@pytest.mark.parametrize(("threshold", "expected"), [(0.0, "auto"), (1.01, False)])
def test_every_pass_of_a_step_takes_the_path_chosen_for_its_rollout(make_module, monkeypatch, threshold, expected):
    monkeypatch.setattr(packing, "AUTO_PACKING_MIN_PADDING", threshold)
    seen = _packings_of_one_step(make_module, monkeypatch)
    assert len(seen) == 4 and set(seen) == {expected}  # old, reference, current twice


def test_a_rollout_without_padding_runs_padded_rows(make_module, monkeypatch):
    seen = _packings_of_one_step(make_module, monkeypatch, module_cls=FixedLength)
    assert set(seen) == {False}


def test_a_chosen_packing_is_kept(make_module, monkeypatch):
    assert set(_packings_of_one_step(make_module, monkeypatch, module_cls=FixedLength, packing=True)) == {True}
