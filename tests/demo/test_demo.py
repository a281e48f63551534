"""The demo: a short run checks the output, the full run (slow) that reward rises, a built wheel that it ships."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lightning_grpo import demo
from tests.cli.conftest import REPO, TINY, run_module
from tests.examples.learning_claims import assert_claims

LINE = re.compile(r"demo: mean reward (\d\.\d\d) -> (\d\.\d\d) over (\d+) iterations \((\d+) s\)")


def test_summary_takes_the_first_and_last_tenth():
    assert demo.summarize([0.0] * 5 + [0.5] * 90 + [1.0] * 5, fraction=0.05) == (0.0, 1.0)
    assert demo.summarize([0.2, 0.4, 0.6]) == (0.2, 0.6)  # at least one value each
    with pytest.raises(ValueError, match="no rewards"):
        demo.summarize([])


def test_a_short_demo_prints_its_line_and_writes_metrics_and_plot(tmp_path, warm_tiny_cache):
    result = run_module("lightning_grpo", "demo", "--max-steps", "6", "--output-dir", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    match = LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    assert int(match.group(3)) == 6
    metrics = tmp_path / "tiny" / "version_0" / "metrics.csv"
    assert demo.read_rewards(metrics) and len(demo.read_rewards(metrics)) == 6
    plot = tmp_path / "tiny" / "version_0" / "reward_curve.png"
    assert plot.stat().st_size > 1000  # drawn by RewardCurve
    output = result.stdout + result.stderr
    assert output.count(str(metrics)) == 1 and output.count(str(plot)) == 1, output  # each path printed once
    assert str(metrics) in result.stdout  # in the fit's summary
    assert [line for line in lines if "mean reward" in line] == [lines[-1]]  # one reward line: the demo's, not fit's


def test_a_busy_machine_is_named_as_the_reason_for_a_slow_run(monkeypatch, capsys):
    monkeypatch.setattr("lightning_grpo.iteration.cpu_threads.cores_busy_elsewhere", lambda: 1.5)
    assert demo.announce_busy_cores("demo") == 1.5
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"demo: other processes keep 1\.5 of the \d+ CPU cores busy: this run will take longer "
                        r"than the documented times \(measured on idle cores\)", line), line  # fmt: skip
    monkeypatch.setattr("lightning_grpo.iteration.cpu_threads.cores_busy_elsewhere", lambda: 0.1)
    demo.announce_busy_cores("demo")
    assert capsys.readouterr().err == ""  # an idle machine: nothing to explain


def test_the_demo_refuses_a_missing_config(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        demo.main(["--config", str(tmp_path / "nope.yaml")])


@pytest.mark.slow
@pytest.mark.learning
def test_the_full_demo_raises_the_reward(tmp_path, warm_tiny_cache, capsys):
    """The whole demo (300 iterations, about 20-60 s on two cores): the exact-answer rate rises by 0.3 or more.

    ``python -m benchmarks.learning --cases demo`` (3 seeds x 3 CPU capabilities, docs/benchmarks.md): 0.50-0.51.
    """
    first, last, steps = demo.main(["--output-dir", str(tmp_path)])
    assert steps == 300
    assert_claims("demo", first, last)  # a rise of 0.3 or more
    assert LINE.fullmatch(capsys.readouterr().out.strip().splitlines()[-1])
    assert Path(tmp_path / "tiny" / "version_0" / "reward_curve.png").exists()


def test_the_repository_config_is_the_packaged_one():
    assert TINY.is_symlink() and TINY.resolve() == demo.DEFAULT_CONFIG
    assert demo.DEFAULT_CONFIG.parent == Path(demo.__file__).resolve().parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the package (so the shared checkout gets no build files)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "lightning_grpo", source / "lightning_grpo", ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist"]
    result = subprocess.run([*command, source], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (root / "dist").glob("lightning_grpo-*.whl")
    return path


def test_the_wheel_ships_the_demo_config(wheel):
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("lightning_grpo/demo/tiny.yaml") == demo.DEFAULT_CONFIG.read_bytes()
        assert "lightning_grpo/demo/__init__.py" in archive.namelist()


@pytest.mark.slow
def test_the_demo_runs_from_the_wheel_outside_the_repository(wheel, tmp_path, warm_tiny_cache):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    where = "import lightning_grpo.demo as d; print(d.DEFAULT_CONFIG)"
    found = subprocess.run([sys.executable, "-c", where], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert Path(found.stdout.strip()) == site / "lightning_grpo" / "demo" / "tiny.yaml"  # the wheel's copy runs
    command = [sys.executable, "-m", "lightning_grpo", "demo", "--max-steps", "2", "--output-dir", str(tmp_path / "o")]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert LINE.fullmatch(result.stdout.strip().splitlines()[-1])
    metrics = tmp_path / "o" / "tiny" / "version_0" / "metrics.csv"
    assert (result.stdout + result.stderr).count(str(metrics)) == 1 and str(metrics) in result.stdout  # the summary
