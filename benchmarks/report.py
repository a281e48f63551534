"""Summaries of the per-step records (medians after warm-up, derived ratios) and the printed table."""

from __future__ import annotations

from typing import Any

from benchmarks.measure import decode_floor_seconds, median, update_flops
from benchmarks.models import ParamCounts
from benchmarks.workload import Workload

__all__ = ["compare", "format_table", "summarize"]

PHASES = ("generate", "score", "old_logprobs", "reference", "update")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def summarize(raw: dict[str, Any], work: Workload, counts: ParamCounts, limits: dict[str, Any]) -> dict[str, Any]:
    """Medians over the measured steps (warm-up steps dropped) and the derived fractions of the device limits.

    Args:
        raw: A side's result from :mod:`benchmarks.child` (``steps`` records, ``peak_memory_bytes``, ...).
        work: The workload.
        counts: Parameter counts of the model.
        limits: Device limits from the ``limits`` child (bandwidth, matmul peak).

    Returns:
        The side's summary: seconds per phase and per step, tokens/s, peak memory, MFU and decode-floor fraction.
    """
    steps = raw["steps"][work.warmup_steps :]
    phases = {p: median([s["phases"][p] for s in steps]) for p in PHASES}
    cpu_phases = {p: median([s["cpu_phases"][p] for s in steps]) for p in PHASES}
    update_s, generate_s = phases["update"], phases["generate"]
    flops = median([update_flops(counts, s["trained_tokens"]) for s in steps])
    floor = decode_floor_seconds(
        counts,
        work.rows,
        work.prompt_length,
        work.max_new_tokens,
        _DTYPE_BYTES[work.dtype],
        limits["bandwidth_bytes_per_s"],
    )
    return {
        "framework": raw["framework"],
        "measured_steps": len(steps),
        "step_seconds": median([s["step_seconds"] for s in steps]),
        "step_seconds_range": _range([s["step_seconds"] for s in steps]),
        "phase_seconds_range": {p: _range([s["phases"][p] for s in steps]) for p in PHASES},
        "step_cpu_seconds": median([s["step_cpu_seconds"] for s in steps]),
        "phase_seconds": phases,
        "phase_cpu_seconds": cpu_phases,
        "generated_tokens_per_s": median([s["generated_tokens"] / max(s["phases"]["generate"], 1e-9) for s in steps]),
        "trained_tokens_per_s": median([s["trained_tokens"] / max(s["phases"]["update"], 1e-9) for s in steps]),
        "peak_memory_bytes": raw["peak_memory_bytes"],
        "memory_kind": raw["memory_kind"],
        "threads": raw["threads"],
        "update_mfu": flops / update_s / limits["matmul_flops_per_s"] if update_s > 0 else float("nan"),
        "decode_floor_seconds": floor,
        "decode_floor_fraction": floor / generate_s if generate_s > 0 else float("nan"),
        "steps": raw["steps"],
    }


def _range(values: list[float]) -> list[float]:
    """``[min, max]`` of ``values`` (NaNs for none)."""
    return [min(values), max(values)] if values else [float("nan")] * 2


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Our figures over theirs (below 1 is better for us)."""
    return {
        "step_time_ratio": ours["step_seconds"] / theirs["step_seconds"],
        "step_cpu_time_ratio": ours["step_cpu_seconds"] / theirs["step_cpu_seconds"],
        "peak_memory_ratio": ours["peak_memory_bytes"] / theirs["peak_memory_bytes"],
    }


def _rows(sides: dict[str, dict[str, Any]]) -> list[tuple[str, list[str]]]:
    pick = lambda fn: [fn(s) for s in sides.values()]  # noqa: E731
    rows = [("step s, wall (cpu)", pick(lambda s: f"{s['step_seconds']:.2f} ({s['step_cpu_seconds']:.2f})"))]
    rows += [("  step s, min-max", pick(lambda s: "{:.2f}-{:.2f}".format(*s.get("step_seconds_range", [0, 0]))))]
    rows += [
        (f"  {p} s", pick(lambda s, p=p: f"{s['phase_seconds'][p]:.2f} ({s['phase_cpu_seconds'][p]:.2f})"))
        for p in PHASES
    ]
    rows += [
        (f"  {p} s, min-max", pick(lambda s, p=p: "{:.2f}-{:.2f}".format(*s["phase_seconds_range"][p])))
        for p in ("reference", "update")
        if all("phase_seconds_range" in s for s in sides.values())
    ]
    rows += [
        ("generated tok/s", pick(lambda s: f"{s['generated_tokens_per_s']:.0f}")),
        ("trained tok/s", pick(lambda s: f"{s['trained_tokens_per_s']:.0f}")),
        ("peak memory MiB", pick(lambda s: f"{s['peak_memory_bytes'] / 2**20:.0f} ({s['memory_kind']})")),
        ("update MFU", pick(lambda s: f"{s['update_mfu']:.1%}")),
        ("decode bw floor", pick(lambda s: f"{s['decode_floor_fraction']:.1%}")),
    ]
    return rows


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table of the sides' summaries, then the ratios when there are two sides."""
    sides: dict[str, dict[str, Any]] = report["sides"]
    header = ["metric", *[s["framework"] for s in sides.values()]]
    rows = [(name, values) for name, values in _rows(sides)]
    widths = [max(len(header[0]), *(len(r[0]) for r in rows))]
    widths += [max(len(header[i + 1]), *(len(r[1][i]) for r in rows)) for i in range(len(sides))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    lines = [line(header), line(["-" * w for w in widths])] + [line([n, *v]) for n, v in rows]
    if "comparison" in report:
        ratios = report["comparison"]
        lines.append(
            f"ours / trl: step time {ratios['step_time_ratio']:.2f}x (cpu {ratios['step_cpu_time_ratio']:.2f}x), "
            f"peak memory {ratios['peak_memory_ratio']:.2f}x"
        )
    return "\n".join(lines)
