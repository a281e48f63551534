"""The learning matrix (``python -m benchmarks.learning``): runs in fresh processes per capability, and its table."""

from __future__ import annotations

import json

from benchmarks import learning


def test_one_case_runs_in_a_child_process_per_capability_and_is_tabled(tmp_path, capsys):
    results = learning.main(["--cases", "count_a", "--seeds", "0", "--capabilities", "default", "--out", str(tmp_path)])
    assert [(r["case"], r["seed"], r["capability"]) for r in results] == [("count_a", 0, "default")]
    assert results[0]["rise"] == results[0]["last"] - results[0]["first"] > 0.3
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert results[0]["kernels"] == "DEFAULT"  # the child ran with torch's portable kernels
    table = (tmp_path / "table.md").read_text()
    assert "| count_a | rise |" in table and "≥ 0.3: holds" in table
    assert "count_a          default  seed 0: first" in capsys.readouterr().out


def test_a_rerun_with_the_same_out_skips_the_runs_already_there(tmp_path, capsys, monkeypatch):
    earlier = [{"case": "count_a", "seed": 0, "capability": "default", "first": 0.0, "last": 0.5, "rise": 0.5}]
    (tmp_path / "results.json").write_text(json.dumps(earlier))
    spawned = []
    monkeypatch.setattr(learning, "_spawn", lambda *job: spawned.append(job[:3]) or {**earlier[0], "seed": job[1]})
    results = learning.main(["--cases", "count_a", "--seeds", "0", "1", "--capabilities", "default", "--out",
                             str(tmp_path), "--jobs", "1"])  # fmt: skip
    assert spawned == [("count_a", 1, "default")]  # seed 0 was there; seed 1 ran and was written as it ended
    assert (
        [r["seed"] for r in json.loads((tmp_path / "results.json").read_text())]
        == [0, 1]
        == [r["seed"] for r in results]
    )
    assert "1 runs already in" in capsys.readouterr().out


def test_the_table_says_when_the_worst_run_misses_a_claim():
    runs = [{"case": "count_a", "seed": s, "capability": "native", "rise": r} for s, r in enumerate([0.5, 0.1])]
    table = learning.table(runs)
    assert "| count_a | rise | 0.30 | 0.10–0.50 | 2 | ≥ 0.3: FAILS |" in table


def test_a_failing_run_names_the_case_seed_and_capability(tmp_path, monkeypatch):
    monkeypatch.setitem(learning.CASES, "broken", learning.Case(lambda seed, out: 1 / 0, {}, "nowhere"))
    try:
        learning._spawn("broken", 3, "avx2", tmp_path)
    except RuntimeError as error:
        assert "broken seed 3 (avx2) failed" in str(error)
    else:  # the child cannot see the monkeypatched case: it fails with an argparse error, still named
        raise AssertionError("a failing run must raise")
