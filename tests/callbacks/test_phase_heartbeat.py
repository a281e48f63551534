"""PhaseHeartbeat: without a progress bar, a log line names the phase of a long iteration; silent with a bar."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from lightning_grpo.callbacks import phase_heartbeat
from lightning_grpo.callbacks.phase_heartbeat import PhaseHeartbeat
from tests.callbacks.helpers import first_char_code, fit


def slow_reward(prompts, completions, **_):
    time.sleep(0.5)  # a slow reward: the heartbeat logs meanwhile
    return first_char_code(prompts, completions)


def test_a_long_phase_gets_log_lines_naming_it_without_a_bar(make_module, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(phase_heartbeat, "rank_zero_info", lines.append)
    heartbeat = PhaseHeartbeat(interval=0.05)
    fit(make_module(reward_funcs=(slow_reward,)), [heartbeat], iterations=1, enable_progress_bar=False)
    scoring = [line for line in lines if ": score " in line]
    assert len(scoring) >= 2, lines  # again and again while the phase runs
    assert re.fullmatch(r"GRPO iteration \(optimizer step 0\): score \d+s \(the iteration \d+s\)", scoring[0])
    assert heartbeat._ticker._thread is None  # stopped with the fit


def test_with_a_progress_bar_the_heartbeat_stays_silent():
    heartbeat = PhaseHeartbeat()
    trainer = SimpleNamespace(is_global_zero=True, progress_bar_callback=object())
    heartbeat.on_train_start(trainer, SimpleNamespace())
    assert heartbeat._ticker._thread is None  # the bar shows the phase itself


def test_a_line_without_a_timed_phase_says_how_long_the_iteration_runs(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(phase_heartbeat, "rank_zero_info", lines.append)
    PhaseHeartbeat()._log_phase(None, 21.4)
    assert lines == ["GRPO iteration (optimizer step 0): running for 21s"]


@pytest.mark.parametrize("interval", [0, -1, float("inf")])
def test_the_interval_is_checked(interval):
    with pytest.raises(ValueError, match="interval must be a finite number > 0"):
        PhaseHeartbeat(interval=interval)
