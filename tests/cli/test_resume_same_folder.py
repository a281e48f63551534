"""A resumed CLI run continues its metrics in the run folder of its checkpoint, without Lightning's three warnings."""

from __future__ import annotations

import csv

from tests.cli.conftest import TINY, quiet_run_args
from tests.cli.run_process import run_cli

WARNINGS = ("dirpath has changed", "LeafSpec", "weights_only")


def test_a_resumed_run_writes_on_in_the_same_version_folder(tmp_path, warm_tiny_cache):
    first = run_cli("fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=2), cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:]
    run = tmp_path / "tiny" / "version_0"
    (checkpoint,) = sorted(run.rglob("*.ckpt"))
    args = ["fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=4), "--ckpt_path", str(checkpoint)]
    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:]
    assert not (tmp_path / "tiny" / "version_1").exists()
    with open(run / "metrics.csv", newline="") as handle:
        steps = [row["step"] for row in csv.DictReader(handle) if row.get("train/loss")]
    assert steps == ["0", "1", "2", "3"]  # one curve, one file
    assert not [warning for warning in WARNINGS if warning in second.stdout], second.stdout
