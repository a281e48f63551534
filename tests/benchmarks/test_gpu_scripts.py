"""The GPU session's scripts run at minimal size on the CPU (their figures are for a GPU: docs/benchmarks.md)."""

from __future__ import annotations

import json

from benchmarks import decode_paths, profile_step

TINY = ["--model", "small-30m", "--G", "2", "--prompt-length", "12"]


def test_every_decode_path_is_timed_against_the_floor(tmp_path, capsys):
    paths = ["generate", "own loop (inverse_cdf)", "generate, merged adapter"]
    decode_paths.main([*TINY, "--prompts", "2", "--max-new-tokens", "3", "--repeats", "1",
                       "--json", str(tmp_path / "d.json"), "--paths", *paths])  # fmt: skip
    report = json.loads((tmp_path / "d.json").read_text())
    assert list(report["paths"]) == paths
    for figures in report["paths"].values():
        assert figures["tokens_per_s"] > 0 and 0 < figures["floor_fraction"] < 1
    assert capsys.readouterr().out.count("tok/s") == len(paths)


def test_the_profile_names_each_phase_with_its_calls(capsys):
    profile_step.main([*TINY, "--rows", "4", "--decode-tokens", "2", "--micro-batch", "2", "--top", "2"])
    phases = [line for line in capsys.readouterr().out.splitlines() if line.startswith("== ")]
    assert [p.split(":")[0] for p in phases] == [
        "== decode 2 tokens x 4 rows, generate", "== decode 2 tokens x 4 rows, own loop",
        "== update",
    ]  # fmt: skip
    assert all("ATen calls" in p for p in phases)
