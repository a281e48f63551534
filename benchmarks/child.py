"""One side of a benchmark in a fresh process: ``python -m benchmarks.child SIDE WORKLOAD_JSON MODEL_DIR OUT_JSON``.

``SIDE`` is ``ours`` or ``trl``; ``ours+limits`` also measures the device limits (copy bandwidth, matmul peak) after
the peak memory has been read. The thread count is fixed through the environment before torch is imported, and the
peak memory read at the end is this process's own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _pin_threads(threads: int) -> None:
    """Fix the thread count through the environment before torch starts (0: leave the machine's default)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if threads:
            os.environ[name] = str(threads)
        else:
            os.environ.pop(name, None)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def run_side(side: str, workload_json: str, model_dir: Path, *, with_limits: bool = False) -> dict[str, Any]:
    """Run ``side``; return its JSON-able result with its peak memory, threads and, if asked, the device limits.

    The limits are measured after the peak memory has been read, so their large buffers do not count.
    """
    import torch

    from benchmarks.measure import device_limits, peak_memory_bytes
    from benchmarks.workload import Workload

    work = Workload.from_json(workload_json)
    if work.threads:  # 0: nothing chosen, PyTorch's own count (every core), and our side applies its default
        torch.set_num_threads(work.threads)
    torch.set_num_interop_threads(1)
    device = work.resolved_device()
    start = time.perf_counter()
    if side == "ours":
        from benchmarks.ours import run_ours

        result: dict[str, Any] = run_ours(work, model_dir)
    elif side == "trl":
        from benchmarks.trl_side import run_trl

        result = run_trl(work, model_dir)
    else:
        raise ValueError(f"unknown side {side!r}: choose 'ours' or 'trl'")
    peak = peak_memory_bytes(device)  # read before anything else allocates
    if device != "cuda":  # our side resets the peak RSS at each step (benchmarks.ours): add back what came before
        peak = max(peak, result.get("peak_before_reset_bytes", 0))
    result.update(
        peak_memory_bytes=peak,
        memory_kind="cuda_max_allocated" if device == "cuda" else "peak_rss",
        threads=torch.get_num_threads(),
        wall_seconds=time.perf_counter() - start,
    )
    if with_limits:
        result["limits"] = device_limits(device, work.torch_dtype)
    return result


def main(argv: list[str]) -> None:
    """Entry point: run one side and write its result to the output path."""
    side, workload_json, model_dir, out = argv
    _pin_threads(json.loads(workload_json)["threads"])
    name, _, extra = side.partition("+")
    result = run_side(name, workload_json, Path(model_dir), with_limits=extra == "limits")
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
