"""default_callbacks, all callbacks in one fit reaching a logger, and what a module brings (docstring examples:
tests/docs)."""

from __future__ import annotations

from lightning.pytorch import Trainer

from lightning_grpo.callbacks import AdapterExport, PredictionWriter, SampleLogger, default_callbacks
from lightning_grpo.callbacks.defaults import module_callbacks
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
        "train/reward_mean",
        "train/group/adv_std",
        "train/reward/count_a",
        "train/clip_frac",
        "train/completion/eos_frac",
        "train/throughput/generated_tokens_per_sec",
        "train/time/iteration",
        "train/memory/peak_mib",
    ):
        assert name in names
    assert (tmp_path / "adapter" / "final" / "adapter_config.json").exists()


def test_no_adapter_export_unless_asked():
    assert not any(isinstance(cb, AdapterExport) for cb in default_callbacks())
    assert default_callbacks(sample_every_n_iterations=7)[-1].every_n_iterations == 7


def test_the_module_brings_a_prediction_writer_only_to_predict_and_only_without_one(tmp_path):
    def brought(trainer: Trainer) -> list[str]:
        return [type(cb).__name__ for cb in module_callbacks(trainer, tool_servers=False, monitoring=False)]

    trainer = Trainer(logger=False, enable_progress_bar=False)
    assert "PredictionWriter" not in brought(trainer)  # fit, validate, test: nothing to write
    trainer.predicting = True
    assert "PredictionWriter" in brought(trainer)
    mine = Trainer(logger=False, callbacks=[PredictionWriter(tmp_path / "mine.jsonl")])
    mine.predicting = True
    assert "PredictionWriter" not in brought(mine)  # the trainer's own writer wins


def test_with_monitoring_lightning_s_summary_becomes_one_line_before_the_bar():
    trainer = Trainer(logger=False)  # Lightning's own summary and bar
    names = [type(cb).__name__ for cb in module_callbacks(trainer, tool_servers=False, monitoring=True)]
    assert names[-2:] == ["PolicySummary", "GRPOProgressBar"]
