"""The demo: a short run checks the output, the full run (slow) that reward rises, a built wheel that it ships."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_grpo.testing import demo
from tests.cli.conftest import run_module

LINE = re.compile(r"demo: mean reward (\d\.\d\d) -> (\d\.\d\d) over (\d+) steps \((\d+) s\)")


def test_summary_takes_the_first_and_last_tenth():
    assert demo.summarize([0.0] * 5 + [0.5] * 90 + [1.0] * 5, fraction=0.05) == (0.0, 1.0)
    assert demo.summarize([0.2, 0.4, 0.6]) == (0.2, 0.6)  # at least one value each
    with pytest.raises(ValueError, match="no rewards"):
        demo.summarize([])


def test_a_short_demo_prints_its_line_and_writes_metrics_and_plot(tmp_path, warm_tiny_cache):
    result = run_module("lightning_grpo", "demo", "--max-steps", "6", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    match = LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    assert int(match.group(3)) == 6
    metrics = tmp_path / "tiny" / "version_0" / "metrics.csv"
    assert f"metrics: {metrics}" in lines
    assert demo.read_rewards(metrics) and len(demo.read_rewards(metrics)) == 6
    plot = tmp_path / "tiny" / "version_0" / "reward_curve.png"
    assert f"reward curve: {plot}" in lines and plot.stat().st_size > 1000


def test_the_demo_refuses_a_missing_config(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        demo.main(["--config", str(tmp_path / "nope.yaml")])


@pytest.mark.slow
def test_the_full_demo_raises_the_reward(tmp_path, warm_tiny_cache, capsys):
    """The whole demo (300 iterations, about 20-60 s on two cores): the exact-answer rate rises by 0.2 or more."""
    first, last, steps = demo.main(["--output-dir", str(tmp_path)])
    assert steps == 300
    assert last - first >= 0.2, (first, last)
    assert LINE.fullmatch(capsys.readouterr().out.strip().splitlines()[-1])
    assert Path(tmp_path / "tiny" / "version_0" / "reward_curve.png").exists()
