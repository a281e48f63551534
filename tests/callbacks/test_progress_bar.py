"""GRPOProgressBar: short names in the bar, full names in the loggers, ``Epoch N`` for ``max_steps`` runs, the phase
of a long iteration refreshed while it runs."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.callbacks import GroupRewardStats, GRPOProgressBar
from lightning_grpo.callbacks._phase_ticker import PhaseTicker, watch_phases
from lightning_grpo.callbacks.progress_bar import SHORT_NAMES
from lightning_grpo.config import ObjectiveConfig
from lightning_grpo.iteration import PhaseTimer
from lightning_grpo.iteration.phase import PhaseClock
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


# ---------------------------------------------------------------- the phase of a long iteration


class PhaseRecordingBar(GRPOProgressBar):
    """Keeps every phase the ticker showed, and the bar's postfix as the training thread saw it during the phase."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.phases: list[str | None] = []
        self.after_batch: list[str] = []

    def _show_phase(self, phase, seconds) -> None:
        self.phases.append(phase)
        super()._show_phase(phase, seconds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.after_batch.append(self.train_progress_bar.postfix or "")


def slow_scorer(seconds: float, seen: list[str], bar: GRPOProgressBar):
    """A reward function whose scoring takes ``seconds``; it records the bar's postfix at its end."""

    def reward(prompts, completions, **_):
        time.sleep(seconds)  # a slow reward model, say: the ticker refreshes the bar meanwhile
        seen.append(bar.train_progress_bar.postfix or "")
        return first_char_code(prompts, completions)

    return reward


def test_a_slow_phase_is_named_in_the_bar_which_refreshes_while_it_runs(make_module):
    bar, seen = PhaseRecordingBar(phase_interval=0.05), []
    module = make_module(reward_funcs=(slow_scorer(0.6, seen, bar),))
    fit(module, [bar], iterations=1, enable_progress_bar=True)
    scoring = [phase for phase in bar.phases if phase and phase.startswith("score ")]
    assert len(scoring) >= 2, bar.phases  # refreshed again and again during one phase, not once
    assert re.fullmatch(r"score \d+s", scoring[-1])
    assert re.search(r"phase=score \d+s$", seen[0]), seen  # what the terminal showed while the reward ran
    assert "phase=" not in bar.after_batch[-1]  # the iteration's end puts the metrics back
    assert bar._ticker._thread is None  # stopped with the fit


def test_the_ticker_waits_one_interval_then_shows_the_running_phase():
    shown, clock = [], PhaseClock()
    ticker = PhaseTicker(5.0, lambda phase, seconds: shown.append((phase, round(seconds))))
    ticker.clock = clock
    assert not ticker.tick(now=100.0)  # no iteration runs
    ticker.iteration_started()
    start = ticker._since
    assert not ticker.tick(now=start + 4.9)  # a short iteration shows nothing: its end redraws the bar anyway
    with clock("generate"):
        clock.current = ("generate", start + 1.0)
        assert ticker.tick(now=start + 12.0)
    assert ticker.tick(now=start + 13.0)  # between two phases
    ticker.iteration_ended()
    assert not ticker.tick(now=start + 60.0)
    assert shown == [("generate 11s", 12), (None, 13)]


def test_the_module_timer_becomes_a_phase_clock_that_keeps_its_device_and_seconds():
    module = SimpleNamespace(timer=PhaseTimer(torch.device("cpu")))
    module.timer.seconds = {"generate": 1.5}
    clock = watch_phases(module)
    assert module.timer is clock and isinstance(clock, PhaseClock)
    assert clock.device == torch.device("cpu") and clock.seconds == {"generate": 1.5}
    assert watch_phases(module) is clock  # installed once
    assert watch_phases(SimpleNamespace()) is None  # not a GRPOModule: no phases, the iteration's time only


@pytest.mark.parametrize("interval", [0, -1.0, 11, float("nan"), "5"])
def test_phase_interval_is_checked(interval):
    with pytest.raises(ValueError, match=r"phase_interval must be a number of seconds in \(0, 10\] or None"):
        GRPOProgressBar(phase_interval=interval)


def test_no_phase_display_without_an_interval():
    assert GRPOProgressBar(phase_interval=None)._ticker is None
