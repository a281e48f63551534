"""``python -m benchmarks.run``: run one GRPO workload on our side (and TRL's with ``--compare trl``).

Every side runs in its own fresh process (peak RSS / CUDA peak are then that side's alone); our side's process also
measures the device limits (copy bandwidth, matmul peak) once its peak is read. Prints a table, writes the JSON.

Example::

    python -m benchmarks.run --model small-30m --prompts 16 --G 8 --prompt-length 64 --max-new-tokens 64 \\
        --threads 1 --compare trl --json build/bench.json

``--workload uneven`` sets the defaults of issue 55's workload (:data:`UNEVEN`: scripted long-tailed lengths, forced
on both sides, checked after each side); ``--variant NAME:FIELD=VALUE,...`` adds our side again with those workload
fields changed, a ``GRPOConfig`` setting named by its group (e.g. ``padded:update.packing=false``,
``tokens:update.micro_batch_tokens=1300,update.micro_batch_size=0``; other fields by their own name: ``threads=4``),
its ratios to our side printed below the table.
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

__all__ = ["UNEVEN", "main", "parse_args", "parse_variant", "spawn_side", "variant_fields"]

_ROOT = Path(__file__).resolve().parents[1]

#: ``--workload uneven`` (issue 55): 8 prompts x G=8 on small-30m, completions of 8-512 tokens (lognormal, median
#: 64, sigma 1; about 80 % padding against the longest row), beta 0.04 (a log-prob pass: the reference), micro-batches
#: of 8 completions, 2 threads, 3 measured steps after 1 warm-up step. Any flag given overrides these.
UNEVEN: dict[str, Any] = {
    "model": "small-30m",
    "prompts": 8,
    "num_generations": 8,
    "prompt_length": 64,
    "max_new_tokens": 512,
    "fixed_length": False,
    "length_dist": "lognormal",
    "length_min": 8,
    "length_median": 64.0,
    "length_sigma": 1.0,
    "kl_coef": 0.04,
    "micro_batch_size": 8,
    "steps": 3,
    "warmup_steps": 1,
    "threads": 2,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The workload flags (:func:`benchmarks.workload.add_workload_arguments`) plus ``--compare`` and ``--json``."""
    from benchmarks.workload import add_workload_arguments

    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--compare", choices=["trl"], default=None, help="also run TRL's GRPOTrainer")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--verbose", action="store_true", help="show the sides' own output")
    parser.add_argument("--workload", choices=["default", "uneven"], default="default", help="a preset of defaults")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:FIELD=VALUE,... our side again (a setting by its group: update.packing=false)",
    )
    parser.add_argument("--min-padding", type=float, default=0.5, help="refuse scripted lengths with less padding")
    known, _ = parser.parse_known_args(argv)
    if known.workload == "uneven":
        parser.set_defaults(**UNEVEN)
    return parser.parse_args(argv)


def variant_fields(work: Any) -> dict[str, str]:
    """Each name ``--variant`` takes -> its workload field: a ``GRPOConfig`` setting by its place in the config
    (``update.packing``, ``sampling.sampler``), every other workload field by its own name (``threads``)."""
    from dataclasses import fields

    from lightning_grpo.config import MOVED_SETTINGS

    return {MOVED_SETTINGS.get(f.name, f.name): f.name for f in fields(work)}


def parse_variant(text: str, work: Any) -> tuple[str, Any]:
    """``NAME:FIELD=VALUE,...`` as ``(NAME, work with those fields)``; values take the type of the field. A field
    that is a ``GRPOConfig`` setting is named as in the config, by its group (``padded:update.packing=false``).

    Raises:
        ValueError: Malformed text or an unknown field (the message lists the fields), or a setting's flat name (the
            message names its group).
    """
    from dataclasses import replace

    from lightning_grpo.config import MOVED_SETTINGS, moved_setting_message

    name, _, spec = text.partition(":")
    if name in ("ours", "trl"):
        raise ValueError(f"--variant {text!r}: name it anything but 'ours' or 'trl' (the sides' own names)")
    names = variant_fields(work)
    changes: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if name and sep and key not in names and MOVED_SETTINGS.get(key) in names:
            raise ValueError(f"--variant {text!r}: {moved_setting_message(key, prefix='')}")
        if not name or not sep or key not in names:
            raise ValueError(f"--variant {text!r}: write NAME:FIELD=VALUE,... with FIELD one of {sorted(names)}")
        kind = type(getattr(work, names[key]))
        if kind is bool and value.lower() not in ("true", "false"):
            raise ValueError(f"--variant {text!r}: {key} takes true or false")
        changes[names[key]] = value.lower() == "true" if kind is bool else kind(value)
    variant = replace(work, **changes)
    variant.check()
    return name, variant


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


def _spawn_all(sides: dict[str, Any], model_dir: Path, tmp: Path, verbose: bool) -> dict[str, Any]:
    """Run every side (our first one also measures the limits); check each one's lengths against the script."""
    from benchmarks.uneven import check_lengths

    raw = {}
    for index, (side, work) in enumerate(sides.items()):  # each side's raw figures are printed as it ends
        kind = "trl" if side == "trl" else ("ours+limits" if index == 0 else "ours")
        raw[side] = spawn_side(kind, work.to_json(), model_dir, tmp, verbose)
        steps = [round(step["step_seconds"], 3) for step in raw[side]["steps"]]
        print(f"{side}: step seconds {steps}, peak memory {raw[side]['peak_memory_bytes'] / 2**30:.2f} GiB", flush=True)
        scripted = work.scripted_lengths()
        if scripted is not None:
            check_lengths(side, [step.get("completion_lengths") or [] for step in raw[side]["steps"]], scripted)
            print(f"{side}: completion lengths of all {len(steps)} rollouts match the script", flush=True)
    return raw


def _summaries(raw: dict[str, Any], sides: dict[str, Any], counts: Any, limits: dict[str, Any]) -> dict[str, Any]:
    """Each side's summary, with its phases against their compute bounds where the lengths are known."""
    from benchmarks.bounds import phase_bounds, side_bounds
    from benchmarks.report import summarize

    out = {}
    for side, work in sides.items():
        summary = summarize(raw[side], work, counts, limits)
        if side not in ("ours", "trl"):
            summary["framework"] = f"ours [{side}]"
        lengths = work.scripted_lengths() or ([work.max_new_tokens] * work.rows if work.fixed_length else None)
        if lengths is not None:
            bounds = phase_bounds(
                counts, work.prompts, work.prompt_length, lengths, limits["matmul_flops_per_s"], work.ppo_epochs
            )
            summary["bounds"] = side_bounds(summary, bounds)
        out[side] = summary
    return out


def _run(work: Any, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    from benchmarks.models import param_counts, prepare_model
    from benchmarks.report import compare

    sides = {"ours": work, **dict(parse_variant(text, work) for text in args.variant)}
    if args.compare == "trl":
        sides["trl"] = work
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        model_dir = prepare_model(work.model, Path(tmp) / "model", dtype=work.torch_dtype, seed=work.seed)
        raw = _spawn_all(sides, model_dir, Path(tmp), args.verbose)
        counts = param_counts(model_dir)
    limits = raw["ours"].pop("limits")
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.run", *argv]),
        "workload": json.loads(work.to_json()),
        "variants": {side: json.loads(w.to_json()) for side, w in sides.items() if side not in ("ours", "trl")},
        "machine": _machine(),
        "limits": limits,
        "params": vars(counts),
        "sides": _summaries(raw, sides, counts, limits),
    }
    if work.scripted_lengths() is not None:
        from benchmarks.uneven import length_summary

        report["lengths"] = length_summary(work.scripted_lengths())
    if "trl" in report["sides"]:
        report["comparison"] = compare(report["sides"]["ours"], report["sides"]["trl"])
    report["variant_ratios"] = {
        side: _ratios(report["sides"]["ours"], report["sides"][side]) for side in report["variants"]
    }
    return report


def _ratios(ours: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """Our side's figures over a variant's: step, log-prob passes, update, peak memory (below 1: ours is lower)."""
    ratio = lambda a, b: a / b if b > 0 else float("nan")  # noqa: E731
    out = {"step": ratio(ours["step_seconds"], other["step_seconds"])}
    out |= {p: ratio(ours["phase_seconds"][p], other["phase_seconds"][p]) for p in ("old_logprobs", "reference")}
    out["update"] = ratio(ours["phase_seconds"]["update"], other["phase_seconds"]["update"])
    out["peak_memory"] = ratio(ours["peak_memory_bytes"], other["peak_memory_bytes"])
    return out


def _print_extras(report: dict[str, Any]) -> None:
    """The ratios to each variant and the split against the compute bound."""
    from benchmarks.bounds import format_bounds

    for side, ratios in report["variant_ratios"].items():
        shown = ", ".join(f"{key} {value:.2f}x" for key, value in ratios.items() if value == value)  # NaN: not run
        print(f"ours / {side}: {shown}")
    if all("bounds" in side for side in report["sides"].values()):
        print(format_bounds(report))


def _check_padding(work: Any, least: float) -> None:
    """Print the scripted lengths' summary; refuse less padding than ``least`` (``--min-padding``)."""
    from benchmarks.uneven import format_summary, length_summary

    lengths = work.scripted_lengths()
    if lengths is None:
        return
    summary = length_summary(lengths)
    print(f"scripted lengths: {format_summary(summary)}", flush=True)
    if summary["padding_share"] < least:
        raise ValueError(
            f"the scripted lengths are {summary['padding_share']:.1%} padding against the longest row, below "
            f"--min-padding {least}: widen --length-sigma or lower --length-median"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print the table; write ``--json``. Returns the report."""
    from benchmarks.report import format_table
    from benchmarks.workload import Workload

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    work = Workload.from_args(args)
    work.check()
    _check_padding(work, args.min_padding)
    report = _run(work, args, argv)
    print(format_table(report))
    _print_extras(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
