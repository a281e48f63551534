"""The rollout-correction, rejection and OPSM metrics of a fit: logged per step through ``MetricSums``."""

from __future__ import annotations

import pytest

from lightning_grpo.config import CorrectionConfig, UpdateConfig
from tests.conftest import make_trainer, prompt_loader

PROMPTS = ["1+1=", "2+3="]


def test_sequence_fractions_and_the_minimum_weight_are_logged(make_module):
    """A band that excludes 1 masks every token (the sampler's and the trainer's log-probs agree to ~1e-6 here), a
    wide rejection band and OPSM threshold drop nothing; sequences are counted over both micro-batches."""
    module = make_module(
        update=UpdateConfig(micro_batch_size=2),
        corrections=CorrectionConfig(
            rollout_correction="token_mask",
            rollout_correction_args={"min": 2.0, "max": 3.0},
            rollout_rejection="geometric",
            rollout_rejection_args={"min": 0.5, "max": 2.0},
            off_policy_mask="opsm",
            off_policy_mask_args={"threshold": 10.0},
        ),
    )
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, prompt_loader(PROMPTS))
    logged = {name: float(value) for name, value in trainer.callback_metrics.items()}
    assert logged["train/rollout_is_weight_min"] == 0.0 and logged["train/rollout_is_weight_max"] == 0.0
    assert logged["train/rollout_is_masked_seq_frac"] == 1.0 and logged["train/rollout_is_masked_frac"] == 1.0
    assert logged["train/rollout_rs_rejected_seq_frac"] == 0.0 and logged["train/opsm_masked_seq_frac"] == 0.0


def test_the_minimum_weight_is_the_smallest_over_the_step(make_module):
    module = make_module(
        update=UpdateConfig(micro_batch_size=2),
        corrections=CorrectionConfig(rollout_correction="token_truncate", rollout_correction_args={"max": 3.0}),
    )
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, prompt_loader(PROMPTS))
    low, high = (float(trainer.callback_metrics[f"train/rollout_is_weight_{end}"]) for end in ("min", "max"))
    assert low <= float(trainer.callback_metrics["train/rollout_is_weight_mean"]) <= high
    assert low == pytest.approx(1.0, abs=1e-3) and "train/rollout_is_masked_seq_frac" not in trainer.callback_metrics
