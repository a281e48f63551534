"""The progress bar shows the reward mean and the KL, which GRPOModule logs with ``prog_bar=True``."""

from __future__ import annotations

from tests.callbacks.helpers import fit


def test_reward_mean_and_kl_reach_the_progress_bar(make_module):
    trainer, recorder = fit(make_module(kl_coef=0.05), [], iterations=2, enable_progress_bar=True)
    shown = trainer.progress_bar_metrics
    assert {"train/reward_mean", "train/kl"} <= set(shown)
    last = recorder.outputs[-1]
    assert shown["train/kl"] == last["metrics"]["kl"].item()
    assert shown["train/reward_mean"] == last["rewards"].rewards.nanmean().item()
