"""Measurements: peak memory of this process, device limits (memory bandwidth, matmul peak), and derived ratios.

Formulas (stated once, used for both sides):

* **Update MFU**: ``4 · N · trained tokens`` FLOPs over the update seconds, against the measured matmul peak, with
  ``N`` the parameters every trained token passes through (decoder layers + output head; the input embedding is a
  lookup). With LoRA the base weights are frozen, so the backward computes activation gradients only: 2N FLOPs per
  token forward + 2N backward (no weight gradients for the base). Trained tokens are completion tokens (× passes);
  prompt positions, attention scores and the LoRA matrices are left out, so this counts useful work only: a side
  that recomputes less (shared prompts) or more (gradient checkpointing) is credited the same FLOPs.
* **Decode bandwidth floor**: every decode step reads all weights once and the KV cache of every row up to its
  length: ``Σ_t [N_total · bytes + rows · 2 · layers · kv_heads · head_dim · bytes · (P + t)]`` over the T steps,
  divided by the measured bandwidth (a large copy: bytes read + bytes written per second). Its fraction is
  floor / measured generate seconds (prefill included in the denominator, so the fraction is a lower bound).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.models import ParamCounts

__all__ = [
    "decode_floor_seconds",
    "device_limits",
    "median",
    "peak_memory_bytes",
    "profiled_peak_bytes",
    "reset_peak_rss",
    "rss_bytes",
    "trim_heap",
    "update_flops",
]


def median(values: Sequence[float]) -> float:
    """Median, or NaN for no values."""
    return statistics.median(values) if values else float("nan")


def peak_memory_bytes(device: str) -> int:
    """Peak of this process: CUDA max allocated bytes on a GPU, else the peak resident set size (``ru_maxrss``)."""
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def rss_bytes(field: str = "VmRSS") -> int | None:
    """This process's resident set size now (``VmRSS``) or its peak (``VmHWM``) from ``/proc/self/status``, in bytes.

    ``None`` where ``/proc`` does not exist (not Linux).
    """
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    values = [int(line.split()[1]) * 1024 for line in lines if line.startswith(f"{field}:")]  # kB
    return values[0] if values else None


def trim_heap() -> None:
    """Hand the memory that glibc's allocator keeps after ``free`` back to the kernel (``malloc_trim(0)``).

    Without it the RSS at a step's start still holds the previous step's freed temporaries (glibc keeps freed blocks
    under its mmap threshold, up to 32 MiB each), so it would not be what the process holds live. A no-op without
    glibc.
    """
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; ``False`` where the kernel does not allow it.

    Writing ``5`` to ``/proc/self/clear_refs`` resets ``VmHWM`` (Linux 4.0+, see ``man 5 proc``); the peak read
    afterwards with ``rss_bytes("VmHWM")`` is then the peak of what ran since, loading and earlier steps excluded.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def profiled_peak_bytes(block: Callable[[], object]) -> int:
    """Peak bytes held at once by the tensors ``block`` allocates, from PyTorch's memory profiler (works on CPU).

    The profiler (``profile_memory`` + ``record_shapes`` + ``with_stack``) records every allocation and free; replaying
    its timeline (CREATE adds the bytes, DESTROY removes them; tensors that existed before are not counted) gives the
    peak, temporaries and tensors saved for backward included. ``tracemalloc`` cannot see torch's allocator, and
    ``ru_maxrss`` is too coarse at these sizes.
    """
    from torch.profiler._memory_profiler import Action

    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        block()
    current = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        current += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, current)
    return peak


def _timed(fn: object, device: str, repeats: int) -> float:
    """Best wall time of ``repeats`` calls of ``fn`` (after one warm-up call)."""
    fn()  # type: ignore[operator]
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _copy_bandwidth(device: str) -> float:
    """Bytes per second of a large device-to-device copy (bytes read + bytes written)."""
    size = (1 << 30) if device == "cuda" else (1 << 28)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * size / _timed(lambda: dst.copy_(src), device, repeats=5)


def _matmul_peak(device: str, dtype: torch.dtype) -> float:
    """FLOP/s of a large square matmul in ``dtype``."""
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _timed(lambda: a @ b, device, repeats=5)


def device_limits(device: str, dtype: torch.dtype) -> dict[str, float | str]:
    """Measured copy bandwidth (bytes/s) and matmul peak (FLOP/s) of ``device``.

    Args:
        device: ``"cuda"`` or ``"cpu"``.
        dtype: The weights' dtype; the matmul is timed in it on CPU, in bfloat16 (tensor cores) on CUDA.

    Returns:
        ``{"bandwidth_bytes_per_s": ..., "matmul_flops_per_s": ..., "matmul_dtype": ...}``.
    """
    mm_dtype = torch.bfloat16 if device == "cuda" else dtype
    return {
        "bandwidth_bytes_per_s": _copy_bandwidth(device),
        "matmul_flops_per_s": _matmul_peak(device, mm_dtype),
        "matmul_dtype": str(mm_dtype),
    }


def update_flops(counts: ParamCounts, trained_tokens: int) -> float:
    """Useful FLOPs of the update passes: ``4 · (N_body + N_head) · trained tokens`` (module docstring)."""
    return 4.0 * (counts.body + counts.head) * trained_tokens


def decode_floor_seconds(
    counts: ParamCounts, rows: int, prompt_length: int, new_tokens: int, dtype_bytes: int, bandwidth: float
) -> float:
    """Seconds the decode steps need at least, reading weights and KV cache at ``bandwidth`` (module docstring)."""
    weights = counts.total * dtype_bytes * new_tokens
    kv_per_position = 2 * counts.layers * counts.kv_heads * counts.head_dim * dtype_bytes
    positions = sum(prompt_length + t for t in range(new_tokens))
    return (weights + rows * kv_per_position * positions) / bandwidth
