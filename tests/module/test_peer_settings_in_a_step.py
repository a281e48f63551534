"""Issue 65 item 3 in a training step: verl's rejection normaliser (``normalise: kept``) counts the whole mini-batch,
also when the rollout serves one update (the old pass then runs), so the step does not depend on the micro-batch."""

from __future__ import annotations

import torch

from lightning_grpo.config import CorrectionConfig, ObjectiveConfig, UpdateConfig
from tests.conftest import make_trainer, prompt_loader
from tests.module.helpers import FixedRolloutModule, fixed_rollout

PROMPTS = ["1+1="] * 4 + ["2+5="] * 4
COMPLETIONS = ["2", "aa", "3", "a b c", "7", "aaaa", "77", "x..."]


def _step(make_module, tokenizer, micro: int | None, normalise: str) -> tuple[dict, dict]:
    module = make_module(
        module_cls=FixedRolloutModule,
        lr=0.05,
        objective=ObjectiveConfig(kl_coef=0.0),
        update=UpdateConfig(micro_batch_size=micro, mini_batch_size=None, ppo_epochs=1),
        corrections=CorrectionConfig(
            rollout_rejection="geometric", rollout_rejection_args={"min": 0.9, "max": 1.1, "normalise": normalise}
        ),
    )
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    with torch.no_grad():  # behaviour log-probs: the policy's own, off by ±0.3 on the odd rows (rejected)
        exact = module.compute_logprobs(rollout).logprobs
    shift = torch.tensor([0.0, 0.3, 0.0, -0.3] * 2)[:, None]
    rollout.logprobs = (exact + shift) * rollout.completion_mask
    module.fixed = rollout
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(PROMPTS[:2]))
    adapter = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
    return {k: v for k, v in trainer.callback_metrics.items() if k.startswith("train/")}, adapter


def test_the_kept_normaliser_counts_the_mini_batch_at_one_update(make_module, tokenizer):
    whole, adapter = _step(make_module, tokenizer, None, "kept")
    split, adapter_split = _step(make_module, tokenizer, 2, "kept")
    assert 0 < whole["train/rollout_rs_rejected_seq_frac"] < 1  # some rows rejected: the normaliser matters
    torch.testing.assert_close(split["train/loss"], whole["train/loss"], atol=1e-6, rtol=1e-5)
    for name, value in adapter.items():
        torch.testing.assert_close(adapter_split[name], value, atol=1e-5, rtol=1e-4)
    counted_all, _ = _step(make_module, tokenizer, None, "all")
    kept_rows = 1 - whole["train/rollout_rs_rejected_seq_frac"]
    assert abs(whole["train/pg_loss"]) > abs(counted_all["train/pg_loss"]) * (1 + 0.5 * (1 - kept_rows))
