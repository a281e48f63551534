"""ThroughputMonitor: rates and phase times from the step's own counts and timings; peak memory."""

from __future__ import annotations

import resource

import pytest
import torch

from lightning_grpo.callbacks import ThroughputMonitor
from lightning_grpo.callbacks.throughput import peak_memory_mib
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from tests.callbacks.helpers import fit


def test_rates_and_times_match_the_step_outputs(make_module):
    module = make_module(
        update=UpdateConfig(ppo_epochs=2, mini_batch_size=4), objective=ObjectiveConfig(kl_coef=0.01)
    )  # phases: generate, score, old_logprobs, ...
    _, recorder = fit(module, [ThroughputMonitor()], iterations=2)
    for out, logged in zip(recorder.outputs, recorder.metrics, strict=True):
        seconds = out["timings"]
        assert set(seconds) == {"sync", "generate", "score", "score/count_a", "old_logprobs", "reference", "update"}
        assert seconds["score/count_a"] <= seconds["score"]  # one reward function's share of the score phase
        generated = out["rollout"].completion_mask.sum().item()  # valid completion tokens
        trained = out["loss_mask"].sum().item() * 2  # loss tokens, each seen once per epoch
        rate = logged["train/throughput/generated_tokens_per_sec"]
        torch.testing.assert_close(rate, torch.tensor(generated / seconds["generate"]))
        rate = logged["train/throughput/trained_tokens_per_sec"]
        torch.testing.assert_close(rate, torch.tensor(trained / seconds["update"]))
        for phase, value in seconds.items():
            torch.testing.assert_close(logged[f"train/time/{phase}"], torch.tensor(value), msg=phase)
        phases = sum(value for phase, value in seconds.items() if "/" not in phase)  # reward times are inside score
        assert logged["train/time/iteration"] >= phases  # the phases happen inside the step
        assert logged["train/memory/peak_mib"] > 0


def test_running_totals_say_they_are_totals(make_module):
    _, recorder = fit(
        make_module(objective=ObjectiveConfig(kl_coef=0.0)), [ThroughputMonitor(log_memory=False)], iterations=2
    )
    completions = tokens = 0
    for iteration, (out, logged) in enumerate(zip(recorder.outputs, recorder.metrics, strict=True), start=1):
        completions += len(out["rollout"])
        tokens += out["rollout"].sampled_mask.sum().item()
        assert logged["train/total_batches"] == iteration and logged["train/total_samples"] == completions
        assert logged["train/total_tokens"] == tokens and logged["train/total_time"] > 0
        assert not {"train/time", "train/batches", "train/samples", "train/lengths"} & set(logged)  # the old names


def test_memory_can_be_left_out(make_module):
    _, recorder = fit(
        make_module(objective=ObjectiveConfig(kl_coef=0.0)),
        [ThroughputMonitor(log_memory=False, prefix="")],
        iterations=1,
    )
    logged = recorder.metrics[0]
    assert "memory/peak_mib" not in logged and "train/memory/peak_mib" not in logged
    assert {"time/generate", "time/score", "time/update", "time/iteration"} <= set(logged)
    assert "time/reference" not in logged  # no KL term: the reference phase did not run


def test_cpu_peak_memory_is_the_process_peak_rss_in_mib():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    assert peak_memory_mib(torch.device("cpu")) >= before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_memory_is_reset_per_step():
    device = torch.device("cuda")
    monitor = ThroughputMonitor()
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # 256 MiB
    del big
    assert peak_memory_mib(device) >= 256
    module = torch.nn.Linear(1, 1).to(device)
    module.device = device  # the hook reads pl_module.device, as on a LightningModule
    monitor.on_train_batch_start(None, module, None, 0)
    assert peak_memory_mib(device) < 256


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fit_logs_the_peak_of_the_step(make_module):
    _, recorder = fit(make_module(), [ThroughputMonitor()], iterations=2, accelerator="cuda")
    for logged in recorder.metrics:
        assert 0 < logged["train/memory/peak_mib"] < torch.cuda.get_device_properties(0).total_memory / 2**20
        assert logged["train/throughput/generated_tokens_per_sec"] > 0


def test_bad_prefix_is_refused():
    with pytest.raises(TypeError, match="prefix must be a string"):
        ThroughputMonitor(prefix=["train/"])


def test_it_uses_lightnings_public_meter_and_overrides_nothing_private():
    from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor

    assert not issubclass(ThroughputMonitor, LightningThroughputMonitor)  # its private _compute is not ours to replace
    lightning_private = {name for name in vars(LightningThroughputMonitor) if name.startswith("_") and name[1] != "_"}
    assert not lightning_private & set(vars(ThroughputMonitor))
    assert LightningThroughputMonitor in ThroughputMonitor.replaces  # given to the trainer, Lightning's wins
