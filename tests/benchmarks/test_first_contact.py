"""The first-contact timer measures what a user sees: the first output, the longest silence, an interrupt."""

from __future__ import annotations

import os
import sys

from benchmarks.first_contact import timed


def test_it_measures_the_first_output_and_the_longest_silence():
    script = "import time; print('a', flush=True); time.sleep(1.5); print('b', flush=True); time.sleep(0.3)"
    result = timed([sys.executable, "-c", script], dict(os.environ))
    assert result.status == 0 and result.text.split() == ["a", "b"]
    assert result.first < 1.5 and 1.4 < result.silence < 3.0 and result.total >= result.first + 1.5
    assert result.row("x").startswith("| x | ") and "`a` … `b`" in result.row("x")


def test_it_interrupts_once_after_the_first_output():
    script = (
        "import time\nprint('started', flush=True)\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n"
        "    print('saved', flush=True)\n"
    )
    result = timed([sys.executable, "-c", script], dict(os.environ), interrupt_after=0.5)
    assert result.text.split() == ["started", "saved"] and result.total < 10
