"""A plain ``Trainer`` in Python: a readable progress bar, one metrics.csv row per step, no agent
columns for a single-turn run."""

from __future__ import annotations

import csv
from collections import Counter

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo.callbacks import AgentStats, GRPOProgressBar, default_callbacks
from tests.conftest import make_trainer, prompt_loader


def _fit(module, tmp_path, prompts=("1+1=", "2+2="), **kwargs):
    trainer = make_trainer(max_steps=3, log_every_n_steps=1, logger=CSVLogger(tmp_path), **kwargs)
    trainer.fit(module, train_dataloaders=prompt_loader(list(prompts)))
    return trainer


def _rows(trainer):
    with open(f"{trainer.logger.log_dir}/metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_plain_trainer_shows_the_readable_progress_bar(make_module, tmp_path):
    trainer = _fit(make_module(), tmp_path, enable_progress_bar=True)
    bars = [c for c in trainer.callbacks if isinstance(c, TQDMProgressBar)]
    assert [type(bar) for bar in bars] == [GRPOProgressBar]


def test_a_progress_bar_the_user_passed_wins(make_module, tmp_path):
    mine = TQDMProgressBar(refresh_rate=5)
    trainer = _fit(make_module(), tmp_path, enable_progress_bar=True, callbacks=[mine])
    assert [c for c in trainer.callbacks if isinstance(c, TQDMProgressBar)] == [mine]


def test_no_progress_bar_when_it_is_disabled(make_module, tmp_path):
    trainer = _fit(make_module(), tmp_path, enable_progress_bar=False)
    assert not any(isinstance(c, TQDMProgressBar) for c in trainer.callbacks)


def test_metrics_csv_has_one_row_per_step_with_the_default_callbacks(make_module, tmp_path):
    trainer = _fit(make_module(), tmp_path, callbacks=default_callbacks())
    steps = Counter(row["step"] for row in _rows(trainer))
    assert steps == {"0": 1, "1": 1, "2": 1}
    assert all(row["train/reward_mean"] for row in _rows(trainer))
    assert "train/total_time" in _rows(trainer)[0]  # Lightning's throughput totals join the step's row


def test_agent_stats_logs_nothing_for_a_single_turn_run(make_module, tmp_path):
    chat = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}]]  # conversational, no tools
    trainer = _fit(make_module(), tmp_path, prompts=chat, callbacks=[AgentStats()])
    assert not [name for name in _rows(trainer)[0] if "/agent/" in name]
