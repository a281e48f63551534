"""``benchmarks.compiled_decode`` at minimal size: every figure of issue 50's item 4 is reported (not its values)."""

from __future__ import annotations

import json

from benchmarks import compiled_decode


def test_compiled_against_eager_per_sampler_with_aten_counts(tmp_path, capsys):
    compiled_decode.main([
        "--model", "small-30m", "--layers", "1", "--prompts", "2", "--G", "2", "--prompt-length", "8",
        "--max-new-tokens", "3", "--repeats", "1", "--backend", "eager", "--profile-layers", "1",
        "--profile-tokens", "2", "--json", str(tmp_path / "c.json"),
    ])  # fmt: skip
    report = json.loads((tmp_path / "c.json").read_text())
    assert list(report["paths"]) == ["multinomial, as_trained", "inverse_cdf, as_trained"]
    assert list(report["paths"]["multinomial, as_trained"])[:3] == ["generate", "eager loop", "compiled"]
    for pair in report["paths"].values():
        assert pair["speedup_vs_eager"] > 0
        for name in ("eager loop", "compiled"):
            figures = pair[name]
            assert figures["tokens_per_s"] > 0 and 0 < figures["matmul_floor_fraction"] < 1
            assert figures["amortised_seconds"] >= figures["seconds"]
    events = report["aten_events_per_step"]
    assert events["eager loop"] > 10 and events["compiled"] > 0 and events["ratio"] > 0
    out = capsys.readouterr().out
    assert out.count("tok/s  warmed") == 5 and "aten:: events per step, compiled / eager loop" in out


def test_decode_paths_times_the_compiled_paths(tmp_path, capsys, monkeypatch):
    from benchmarks import decode_paths
    from lightning_grpo.rollout import compiled_decode as decoder_module

    monkeypatch.setattr(decoder_module, "COMPILE_BACKEND", "eager")  # dynamo's tracing, no code generation
    paths = ["compiled (inverse_cdf)", "compiled (inverse_cdf), merged adapter"]
    decode_paths.main([
        "--model", "small-30m", "--G", "2", "--prompt-length", "12", "--prompts", "2", "--max-new-tokens", "3",
        "--repeats", "1", "--json", str(tmp_path / "d.json"), "--paths", *paths,
    ])  # fmt: skip
    report = json.loads((tmp_path / "d.json").read_text())
    assert list(report["paths"]) == paths
    assert all(figures["tokens_per_s"] > 0 for figures in report["paths"].values())
    assert capsys.readouterr().out.count("tok/s") == len(paths)
