"""``python -m benchmarks.plot_runs``: the metrics of runs side by side, read from CSVLogger files."""

from __future__ import annotations

import pytest

from benchmarks import plot_runs


def test_it_reads_the_logged_steps_and_draws_one_png(tmp_path):
    pytest.importorskip("matplotlib")
    csv = tmp_path / "metrics.csv"
    header = "epoch,step,train/entropy,train/reward_mean,train/zero_std_frac,val/accuracy"
    csv.write_text(f"{header}\n0,0,0.4,0.1,0.75,\n0,1,0.3,0.5,0.25,\n0,1,,,,0.5\n")
    assert plot_runs.series(csv, "train/reward_mean") == [0.1, 0.5]  # the validation row has no training value
    out = plot_runs.main([f"a={csv}", f"b={csv}", "--out", str(tmp_path / "runs.png")])
    assert out.read_bytes().startswith(b"\x89PNG")
