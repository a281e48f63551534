"""``python -m benchmarks.async_rollout`` runs both modes on one workload (its dry run: the frozen-copy backend)."""

from __future__ import annotations

from benchmarks.async_rollout import main


def test_the_benchmark_runs_both_modes_on_the_same_steps(capsys):
    args = "--backend frozen --model tiny --steps 3 --warmup 1 --delay 0 --prompts 2 --generations 2 "
    results = main((args + "--prompt-tokens 4 --new-tokens 3").split())
    assert results["sync"]["staleness"] == [0.0, 0.0, 0.0] and results["async"]["staleness"] == [0.0, 1.0, 1.0]
    assert all(r["step_seconds"] > 0 and "update" in r["phases"] for r in results.values())
    assert "async_rollout saves" in capsys.readouterr().out
