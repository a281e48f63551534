"""default_callbacks, and all callbacks in one fit reaching a logger (docstring examples: tests/docs)."""

from __future__ import annotations

from lightning_grpo.callbacks import AdapterExport, SampleLogger, default_callbacks
from tests.callbacks.helpers import ListLogger, fit


def test_defaults_log_every_metric_to_the_loggers(make_module, tmp_path):
    callbacks = default_callbacks(export_adapter=True, adapter_dirpath=tmp_path)
    samples = next(cb for cb in callbacks if isinstance(cb, SampleLogger))
    assert samples.every_n_steps == 50
    logger = ListLogger()
    fit(make_module(), callbacks, iterations=2, logger=logger)
    assert [step for _, step in logger.logged] == [0, 1]  # one call per iteration, at its first global step
    names = set(logger.logged[-1][0])
    for name in (
        "train/group/zero_var_frac", "train/reward/count_a", "train/clip/clip_frac", "train/completion/eos_frac",
        "train/throughput/generated_tokens_per_sec", "train/time/step", "train/memory/peak_mib",
    ):  # fmt: skip
        assert name in names
    assert (tmp_path / "adapter" / "final" / "adapter_config.json").exists()


def test_no_adapter_export_unless_asked():
    assert not any(isinstance(cb, AdapterExport) for cb in default_callbacks())
    assert default_callbacks(sample_every_n_steps=7)[-1].every_n_steps == 7

