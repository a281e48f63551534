"""GRPOProgressBar: short names in the bar, full names in the loggers, ``Epoch N`` for ``max_steps`` runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.callbacks import GroupRewardStats, GRPOProgressBar
from lightning_grpo.callbacks.progress_bar import SHORT_NAMES
from lightning_grpo.config import ObjectiveConfig
from tests.callbacks.helpers import ListLogger, first_char_code, fit


class RecordingBar(GRPOProgressBar):
    """Keeps each rendered training line, as the terminal would show it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.shown: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.shown.append(self.get_metrics(trainer, pl_module))
        self.lines.append(str(self.train_progress_bar))


def test_bar_shows_short_names_and_loggers_get_full_names(make_module):
    bar, logger = RecordingBar(), ListLogger()
    fit(
        make_module(
            reward_funcs=(first_char_code,), objective=ObjectiveConfig(kl_coef=0.05)
        ),  # groups with signal: no zero_std item
        [GroupRewardStats(), bar],  # the bar last, as Lightning places its own
        iterations=2,
        logger=logger,
        max_epochs=-1,
        max_steps=2,
        enable_progress_bar=True,
    )
    shown, logged = bar.shown[-1], logger.logged[-1][0]
    assert {"reward", "kl"} <= set(shown)
    assert not any(name.startswith(("train/", "val/")) for name in shown)  # no long names in the bar
    assert shown["reward"] == pytest.approx(logged["train/reward_mean"])
    assert shown["kl"] == pytest.approx(logged["train/kl"])
    assert "v_num" not in shown
    for line in bar.lines:
        assert line.startswith("Epoch 0") and "/-" not in line.split(":")[0]  # not "Epoch 0/-2"
        assert len(line) <= 80, line
        assert "reward=" in line


def test_metrics_must_map_strings_to_strings():
    assert SHORT_NAMES["reward"] == "train/reward_mean"
    with pytest.raises(TypeError, match=r"metrics maps short names to metric names, both strings; got 'kl': 3"):
        GRPOProgressBar(metrics={"kl": 3})


@pytest.mark.parametrize(("fraction", "shown"), [(0.0, False), (0.25, True)])
def test_zero_signal_fraction_is_shown_only_while_non_zero(fraction, shown):
    logged = {"train/reward_mean": torch.tensor(0.5), "train/zero_std_frac": torch.tensor(fraction)}
    metrics = GRPOProgressBar().get_metrics(SimpleNamespace(callback_metrics=logged), None)
    assert metrics.get("reward") == 0.5
    assert ("zero_std" in metrics) is shown
    assert metrics.get("zero_std", fraction) == fraction
