"""Behaviour log-probs: the rollout's sampled log-probs serve as old log-probs (``old_logprobs="rollout"``), and the
sampling/training agreement is logged (docs/agents.md, docs/callbacks.md)."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import GRPOConfig, PromptDataModule
from lightning_grpo.config import CorrectionConfig, ObjectiveConfig, UpdateConfig
from tests.conftest import make_trainer, prompt_records, tiny_sampling
from tests.module.helpers import FixedRolloutModule, fixed_rollout

SEVERAL_UPDATES = {"update": UpdateConfig(ppo_epochs=2, mini_batch_size=6), "objective": ObjectiveConfig(kl_coef=0.0)}


def length(completions, **kwargs):
    """A reward that differs within groups, so that the updates move the adapter."""
    return [float(len(c)) for c in completions]


def _fit(make_module, **settings):
    module = make_module(reward_funcs=[length], **settings)
    torch.manual_seed(0)
    trainer = make_trainer(max_steps=2)
    trainer.fit(module, PromptDataModule(prompt_records(6), batch_size=3))
    return module, trainer.callback_metrics


def test_rollout_logprobs_replace_the_recompute_and_train_the_same(make_module):
    recompute, logged = _fit(make_module, **SEVERAL_UPDATES)
    rollout, logged_rollout = _fit(make_module, **SEVERAL_UPDATES, corrections=CorrectionConfig(old_logprobs="rollout"))
    assert "old_logprobs" in recompute.timer.seconds and "old_logprobs" not in rollout.timer.seconds
    for metrics in (logged, logged_rollout):  # sampling and training kernels agree here (CPU, float32)
        assert 0 <= metrics["train/rollout_logprob_diff_mean"] <= metrics["train/rollout_logprob_diff_max"] < 1e-4
    assert logged["train/zero_std_frac"] < 1
    trained = dict(rollout.policy.named_parameters())
    for name, param in recompute.policy.named_parameters():
        if param.requires_grad:  # same seeds, same draws: the adapters differ only by the kernels' agreement
            torch.testing.assert_close(trained[name], param, atol=1e-4, rtol=1e-3)


def test_agreement_is_logged_when_one_update_uses_the_rollout(make_module):
    _, metrics = _fit(make_module)
    assert metrics["train/rollout_logprob_diff_max"] < 1e-4


def test_rollout_mode_needs_rollout_logprobs(make_module, tokenizer):
    module = make_module(
        module_cls=FixedRolloutModule,
        **SEVERAL_UPDATES,
        corrections=CorrectionConfig(old_logprobs="rollout"),
        sampling=tiny_sampling(num_generations=6),
    )
    module.fixed = fixed_rollout(tokenizer, ["1+1="] * 6, ["2", "3", "4", "5", "6", "7"], group_size=6)
    with pytest.raises(ValueError, match=r"Rollout\.logprobs"):
        make_trainer(max_steps=1).fit(module, PromptDataModule(prompt_records(6), batch_size=1))


def test_old_logprobs_names_its_choices():
    with pytest.raises(ValueError, match="'recompute', 'rollout'"):
        GRPOConfig(corrections=CorrectionConfig(old_logprobs="sampler"))


def test_rollout_mode_with_one_update_takes_the_sampler_log_probs(make_module, tokenizer):
    # verl's bypass mode: with one update per rollout the old log-probs are the sampler's too, so the ratio is pi/mu
    # from the first update on (DPPO's paper setting); recompute keeps the ratio at exactly 1.
    def shifted(module):
        rollout = fixed_rollout(tokenizer, ["1+1="] * 6, ["2", "3", "4", "5", "6", "7"], group_size=6)
        rollout.logprobs = torch.zeros(rollout.completion_ids.shape)  # mu = 1: the sampler was sure of every token
        module.fixed = rollout
        return module

    kl = {}
    for mode in ("rollout", "recompute"):
        module = shifted(make_module(module_cls=FixedRolloutModule, reward_funcs=[length],
                                     corrections=CorrectionConfig(old_logprobs=mode),
                                     sampling=tiny_sampling(num_generations=6),
                                     objective=ObjectiveConfig(kl_coef=0.0)))  # fmt: skip
        trainer = make_trainer(max_steps=1)
        trainer.fit(module, PromptDataModule(prompt_records(6), batch_size=1))
        kl[mode] = float(trainer.callback_metrics["train/approx_kl"])
    assert kl["recompute"] == 0.0
    assert kl["rollout"] > 0.5  # mean(log mu - log pi) = -mean(log pi) over the loss tokens of a random tiny model


class _RatioRecorder(FixedRolloutModule):
    """Records each mini-batch's mean ratio ``π_θ / π_old`` over its loss tokens (``None``: no old log-probs)."""

    ratios: list[float | None]

    def compute_loss(self, batch, counts):
        old = batch.old_logprobs
        if old is None:
            self.ratios.append(None)
        else:
            with torch.no_grad():
                current = self.compute_logprobs(batch.rollout).logprobs
            mask = batch.loss_mask.float()
            self.ratios.append(float(((current - old).exp() * mask).sum() / mask.sum()))
        return super().compute_loss(batch, counts)


def test_an_agent_rollout_of_ten_rows_in_minibatches_of_eight_recomputes_old_logprobs(make_module, tokenizer):
    # Two mini-batches (8 rows, then 2): two optimizer steps, so pi_old must be the rollout's policy, recomputed
    # before the first update; the second mini-batch, trained after the first step, sees a ratio that is not 1.
    # A floor (10 // 8 = 1 update) would skip the recompute and leave the second ratio at exactly 1.
    completions = ["a", "aa", "aaa", "b", "ab", "aab", "aaab", "bb", "abb", "aaaa"]
    rollout = fixed_rollout(tokenizer, ["1+1="] * 10, completions, group_size=5)
    # 2 prompts x G=4 = 8 trajectories; trajectories 0 and 4 branched once (a compacted context): 10 rows
    trajectories = [0, 0, 1, 2, 3, 4, 4, 5, 6, 7]
    last = [i == 9 or trajectories[i + 1] != t for i, t in enumerate(trajectories)]
    rollout.columns = {
        "agent_reward": [None] * 10,
        "agent_trajectory": trajectories,
        "agent_last": last,
        "agent_error": [None] * 10,
    }
    update, objective = UpdateConfig(mini_batch_size=8), ObjectiveConfig(kl_coef=0.0)
    sampling = tiny_sampling(num_generations=4)
    module = make_module(
        module_cls=_RatioRecorder, reward_funcs=[length], sampling=sampling, update=update, objective=objective
    )
    module.fixed, module.ratios = rollout, []
    make_trainer(max_steps=2).fit(module, PromptDataModule(prompt_records(2), batch_size=2))
    assert "old_logprobs" in module.timer.seconds
    assert module.config.update.updates(len(rollout)) == 2
    first, second = module.ratios[:2]
    assert first == pytest.approx(1.0, abs=1e-6)  # before any step: π_θ = π_old
    assert abs(second - 1.0) > 1e-4  # after the first step
