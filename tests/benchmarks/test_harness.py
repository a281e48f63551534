"""A fast run of the benchmark harness (tiny model, two steps) and the fields of its JSON report."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks.run import main

PHASES = {"generate", "score", "old_logprobs", "reference", "update"}
SIDE_FIELDS = {
    "framework", "step_seconds", "step_cpu_seconds", "phase_seconds", "phase_cpu_seconds", "generated_tokens_per_s",
    "trained_tokens_per_s", "peak_memory_bytes", "memory_kind", "threads", "update_mfu", "decode_floor_fraction",
}  # fmt: skip
ARGS = ["--model", "tiny", "--prompts", "2", "--G", "2", "--prompt-length", "6", "--max-new-tokens", "5"]
ARGS += ["--steps", "1", "--warmup-steps", "1", "--threads", "1"]


def _check_side(side: dict) -> None:
    assert set(side) >= SIDE_FIELDS
    assert set(side["phase_seconds"]) == PHASES and side["threads"] == 1
    assert side["step_seconds"] > 0 and side["peak_memory_bytes"] > 0
    assert len(side["steps"]) == 2 and all(step["generated_tokens"] == 2 * 2 * 5 for step in side["steps"])


@pytest.mark.slow
def test_harness_runs_our_side_and_writes_the_report(tmp_path, capsys):
    path = tmp_path / "bench.json"
    main([*ARGS, "--kl-coef", "0.01", "--json", str(path)])
    report = json.loads(path.read_text())
    assert {"command", "workload", "machine", "limits", "params", "sides"} <= set(report)
    assert report["workload"]["model"] == "tiny" and report["machine"]["cores"] >= 1
    _check_side(report["sides"]["ours"])
    assert report["sides"]["ours"]["phase_seconds"]["reference"] > 0  # β > 0: the reference pass ran and was timed
    assert "step s" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (pip install -e .[bench])")
def test_harness_compares_with_trl(tmp_path):
    path = tmp_path / "bench.json"
    main([*ARGS, "--compare", "trl", "--json", str(path)])
    report = json.loads(path.read_text())
    _check_side(report["sides"]["trl"])
    assert report["comparison"]["step_time_ratio"] > 0 and report["comparison"]["peak_memory_ratio"] > 0
