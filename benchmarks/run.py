"""``python -m benchmarks.run``: run one GRPO workload on our side (and TRL's with ``--compare trl``).

Every side runs in its own fresh process (peak RSS / CUDA peak are then that side's alone); our side's process also
measures the device limits (copy bandwidth, matmul peak) once its peak is read. Prints a table, writes the JSON.

Example::

    python -m benchmarks.run --model small-30m --prompts 16 --G 8 --prompt-length 64 --max-new-tokens 64 \\
        --threads 1 --compare trl --json build/bench.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["main", "parse_args", "spawn_side"]

_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The workload flags (:func:`benchmarks.workload.add_workload_arguments`) plus ``--compare`` and ``--json``."""
    from benchmarks.workload import add_workload_arguments

    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--compare", choices=["trl"], default=None, help="also run TRL's GRPOTrainer")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--verbose", action="store_true", help="show the sides' own output")
    return parser.parse_args(argv)


def spawn_side(side: str, workload_json: str, model_dir: Path, tmp: Path, verbose: bool) -> dict[str, Any]:
    """Run one side in a fresh interpreter and return its JSON result (its log's tail on failure)."""
    out, log = tmp / f"{side}.json", tmp / f"{side}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "benchmarks.child", side, workload_json, str(model_dir), str(out)]
    with log.open("w") as sink:
        done = subprocess.run(command, env=env, cwd=_ROOT, stdout=sink, stderr=subprocess.STDOUT, check=False)
    if verbose or done.returncode:
        print(log.read_text()[-6000:], file=sys.stderr)
    if done.returncode:
        raise RuntimeError(f"the {side!r} side failed with exit code {done.returncode} (its log is above)")
    return json.loads(out.read_text())


def _machine() -> dict[str, Any]:
    """Where the figures come from: CPU model, cores, load, versions, date."""
    import torch

    cpu = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _run(work: Any, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    from benchmarks.models import param_counts, prepare_model
    from benchmarks.report import compare, summarize

    sides = ["ours", *(["trl"] if args.compare == "trl" else [])]
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        model_dir = prepare_model(work.model, Path(tmp) / "model", dtype=work.torch_dtype, seed=work.seed)
        names = {"ours": "ours+limits", "trl": "trl"}  # our process also measures the device limits
        raw = {}
        for side in sides:  # each side's raw figures are printed as it ends: a run cut short keeps them
            raw[side] = spawn_side(names[side], work.to_json(), model_dir, Path(tmp), args.verbose)
            steps = [round(step["step_seconds"], 3) for step in raw[side]["steps"]]
            print(f"{side}: step seconds {steps}, peak memory {raw[side]['peak_memory_bytes'] / 2**30:.2f} GiB",
                  flush=True)  # fmt: skip
        counts = param_counts(model_dir)
    limits = raw["ours"].pop("limits")
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.run", *argv]),
        "workload": json.loads(work.to_json()),
        "machine": _machine(),
        "limits": limits,
        "params": vars(counts),
        "sides": {side: summarize(raw[side], work, counts, limits) for side in sides},
    }
    if "trl" in report["sides"]:
        report["comparison"] = compare(report["sides"]["ours"], report["sides"]["trl"])
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print the table; write ``--json``. Returns the report."""
    from benchmarks.report import format_table
    from benchmarks.workload import Workload

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    work = Workload.from_args(args)
    work.check()
    report = _run(work, args, argv)
    print(format_table(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
