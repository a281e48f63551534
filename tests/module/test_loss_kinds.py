"""The issue-37 policy losses in a training step: their own metrics are logged as ``train/<name>``, exact over
micro-batches (token-weighted sums, ``metrics.MetricSums``), and the clip/KL-Cov choice is seeded by the step."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from tests.conftest import make_trainer, prompt_loader
from tests.module.helpers import FixedRolloutModule, fixed_rollout

PROMPTS = ["1+1="] * 4 + ["2+5="] * 4
COMPLETIONS = ["2", "aa", "3", "a b c", "7", "aaaa", "77", "x..."]
#: kind -> (loss_kind_args, its own metrics). Two passes over the rollout: the second is off-policy.
KINDS = {
    "sapo": ({}, ["sapo_gate_mean"]),
    "gmpo": ({}, ["gmpo_seq_ratio_mean"]),
    "dppo_tv": ({"threshold_low": 0.01, "threshold_high": 0.01},
                ["dppo_masked_frac", "dppo_divergence_mean", "dppo_ratio_capped_frac"]),
    "dppo_kl": ({}, ["dppo_masked_frac", "dppo_divergence_mean", "dppo_ratio_capped_frac"]),
    "gpg": ({}, []),
    "clip_cov": ({"clip_cov_ratio": 0.1, "clip_cov_lb": 0.0}, ["cov_selected_frac"]),
    "kl_cov": ({"kl_cov_ratio": 0.1}, ["cov_selected_frac"]),
}  # fmt: skip


def _step(make_module, tokenizer, kind: str, micro: int | None) -> tuple[dict, dict]:
    args, _ = KINDS[kind]
    module = make_module(
        module_cls=FixedRolloutModule,
        lr=0.05,
        objective=ObjectiveConfig(loss_kind=kind, loss_kind_args=args or None, kl_coef=0.0),
        update=UpdateConfig(micro_batch_size=micro, mini_batch_size=None, ppo_epochs=2),
    )
    module.fixed = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(PROMPTS[:2]))
    adapter = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
    return {k: v for k, v in trainer.callback_metrics.items() if k.startswith("train/")}, adapter


@pytest.mark.parametrize("kind", ["sapo", "gmpo", "dppo_tv", "dppo_kl", "gpg"])
def test_own_metrics_are_logged_and_do_not_depend_on_micro_batch_size(make_module, tokenizer, kind):
    whole, _ = _step(make_module, tokenizer, kind, None)
    split, _ = _step(make_module, tokenizer, kind, 2)
    for name in ["loss", "pg_loss", "clip_frac", "approx_kl", *KINDS[kind][1]]:
        torch.testing.assert_close(split[f"train/{name}"], whole[f"train/{name}"], atol=1e-6, rtol=1e-5)
    assert whole["train/approx_kl"] != 0  # the second pass was off-policy


def test_the_off_policy_pass_shows_in_the_metrics(make_module, tokenizer):
    sapo, _ = _step(make_module, tokenizer, "sapo", None)
    assert 0 < sapo["train/sapo_gate_mean"] < 1  # 1 on-policy; below 1 once the ratio moved
    dppo, _ = _step(make_module, tokenizer, "dppo_tv", None)
    assert 0 < dppo["train/dppo_masked_frac"] < 1  # a tight threshold masks some tokens of the second pass


@pytest.mark.parametrize("kind", ["clip_cov", "kl_cov"])
def test_covariance_losses_log_their_selection_and_repeat_with_the_seed(make_module, tokenizer, kind):
    first, adapter = _step(make_module, tokenizer, kind, None)
    again, adapter_again = _step(make_module, tokenizer, kind, None)
    assert 0 < first["train/cov_selected_frac"] <= 0.5
    torch.testing.assert_close(again["train/cov_selected_frac"], first["train/cov_selected_frac"])
    for name, value in adapter.items():
        torch.testing.assert_close(adapter_again[name], value)  # the same seed chooses the same tokens
