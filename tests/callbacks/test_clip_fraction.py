"""ClipFractionMonitor: logs the update statistics of each step's outputs under ``clip/``."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.callbacks import ClipFractionMonitor
from lightning_grpo.callbacks.clip_fraction import CLIP_METRICS
from tests.callbacks.helpers import first_char_code, fit


def test_logs_each_metric_of_the_step_outputs(make_module):
    # Two epochs of two mini-batches with a large step size: later updates see ratios far from 1, so clipping happens.
    module = make_module((first_char_code,), lr=0.5, ppo_epochs=2, mini_batch_size=4, max_grad_norm=None, kl_coef=0.0)
    _, recorder = fit(module, [ClipFractionMonitor()], iterations=2)
    for out, logged in zip(recorder.outputs, recorder.metrics, strict=True):
        for name in CLIP_METRICS:
            torch.testing.assert_close(logged[f"train/clip/{name}"], out["metrics"][name].float(), msg=name)
    assert any(logged["train/clip/clip_frac"] > 0 for logged in recorder.metrics)  # the test is not vacuous


def test_a_subset_under_another_prefix(make_module):
    _, recorder = fit(make_module(), [ClipFractionMonitor(metrics=["approx_kl"], prefix="")], iterations=1)
    logged = {name for name in recorder.metrics[0] if "clip/" in name}
    assert logged == {"clip/approx_kl"}


def test_unknown_metric_names_the_allowed_ones():
    with pytest.raises(
        ValueError, match=r"unknown metrics \['clip_ratio'\]; choose among 'clip_frac', 'clip_frac_low'"
    ):
        ClipFractionMonitor(metrics=("clip_frac", "clip_ratio"))
