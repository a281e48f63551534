"""default_callbacks, and all callbacks in one fit reaching a logger (docstring examples: tests/docs)."""

from __future__ import annotations

from lightning_grpo.callbacks import AdapterExport, SampleLogger, default_callbacks
from tests.callbacks.helpers import ListLogger, fit


def test_defaults_log_every_metric_to_the_loggers(make_module, tmp_path):
    callbacks = default_callbacks(export_adapter=True, adapter_dirpath=tmp_path)
    samples = next(cb for cb in callbacks if isinstance(cb, SampleLogger))
    assert samples.every_n_iterations == 50
    logger = ListLogger()
    fit(make_module(), callbacks, iterations=2, logger=logger)
    # one logger call per iteration: Lightning's throughput totals join the step's metrics
    assert sorted({step for _, step in logger.logged}) == [0, 1]
    names = {name for metrics, step in logger.logged if step == 1 for name in metrics}
    assert not any(name.startswith(("train/clip/", "train/group/reward")) for name in names)  # one name each
    for name in (
        "train/reward_mean", "train/group/adv_std", "train/reward/count_a", "train/clip_frac",
        "train/completion/eos_frac",
        "train/throughput/generated_tokens_per_sec", "train/time/iteration", "train/memory/peak_mib",
    ):  # fmt: skip
        assert name in names
    assert (tmp_path / "adapter" / "final" / "adapter_config.json").exists()


def test_no_adapter_export_unless_asked():
    assert not any(isinstance(cb, AdapterExport) for cb in default_callbacks())
    assert default_callbacks(sample_every_n_iterations=7)[-1].every_n_iterations == 7
