"""PhaseClock: the phase running now, for a thread to read; the seconds per phase as PhaseTimer counts them."""

from __future__ import annotations

import pytest

from lightning_grpo.iteration.phase import PhaseClock, describe_phase


def test_the_running_phase_is_kept_and_an_inner_phase_hands_back_to_the_outer_one():
    clock = PhaseClock()
    assert clock.current is None and describe_phase(clock) is None
    with clock("update"):
        outer = clock.current
        assert outer[0] == "update"
        with clock("reference"):
            assert clock.current[0] == "reference"
        assert clock.current == outer  # the outer phase, with its own start
    assert clock.current is None
    assert set(clock.seconds) == {"update", "reference"}  # timed as PhaseTimer times them


def test_a_failing_phase_is_no_longer_the_running_one():
    clock = PhaseClock()
    with pytest.raises(KeyError), clock("score"):
        raise KeyError("reward")
    assert clock.current is None and "score" in clock.seconds


def test_the_description_names_the_phase_and_its_whole_seconds():
    clock = PhaseClock()
    clock.current = ("generate", 100.0)
    assert describe_phase(clock, now=112.6) == "generate 13s"
    assert describe_phase(None) is None
