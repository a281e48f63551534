"""QLoRA memory: one GRPO step with a float32, bfloat16, NF4 and int8 base, gradient checkpointing off and on.

Every case runs the real ``GRPOModule`` (:mod:`benchmarks.ours`) in a fresh process through the harness's child
(:mod:`benchmarks.child`), on the same workload and the same random-weight model files, and is checked against the
memory model of ``docs/quantization.md`` (:mod:`benchmarks.memory_model`). Three memory figures per case, all RSS
read from ``/proc/self/status``:

* process peak: ``ru_maxrss`` over the whole run, loading (and quantizing) the model included;
* at step start: the RSS when the measured step begins (weights, adapter, AdamW state, libraries);
* step peak: the peak RSS of the measured step alone (``VmHWM`` reset at its start).

The model's figure is compared with the step peak minus the RSS the process had before it loaded the model (torch,
transformers, peft, bitsandbytes and lightning imported). See the "QLoRA memory" section of ``docs/benchmarks.md``::

    OMP_NUM_THREADS=1 python -m benchmarks.quantization --json build/qlora-memory.json   # ~15 min on one core
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

__all__ = ["CASES", "format_tables", "main", "run_case"]

#: (label, weight dtype of everything unquantized, quantization): the 4- and 8-bit bases keep bfloat16 around them,
#: as the 7B config does (int8 refuses float32, see policy/quantization.py).
CASES = [("float32", "float32", "none"), ("bfloat16", "bfloat16", "none"), ("NF4", "bfloat16", "nf4")]
CASES += [("int8", "bfloat16", "int8")]
MiB = 2**20


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quantization", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b", help="a preset of benchmarks.models")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--G", type=int, default=4, dest="num_generations")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--kl-coef", type=float, default=0.001, help="non-zero: the reference pass runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="*", default=None, help="labels to run (default: all): float32 NF4 ...")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of an earlier --json, run nothing")
    return parser.parse_args(argv)


def run_case(work: Any, model_dir: Path, tmp: Path, verbose: bool) -> dict[str, Any]:
    """One case in a fresh process: step seconds and the three RSS figures of the measured step."""
    from benchmarks.run import spawn_side

    raw = spawn_side("ours", work.to_json(), model_dir, tmp, verbose)
    step = raw["steps"][-1]  # one warm-up step (AdamW allocates its state there), then the measured one
    return {
        "step_seconds": step["step_seconds"],
        "step_cpu_seconds": step["step_cpu_seconds"],
        "process_peak_bytes": raw["peak_memory_bytes"],
        "libraries_bytes": raw["libraries_rss_bytes"],
        "step_start_bytes": step["rss_start_bytes"],
        "step_peak_bytes": step["step_peak_rss_bytes"],
        "step_start_file_bytes": step["rss_file_start_bytes"],
        "phase_peak_bytes": step["phase_peak_rss_bytes"],
        "generated_tokens": step["generated_tokens"],
        "trained_tokens": step["trained_tokens"],
    }


def _estimate(work: dict[str, Any]) -> Any:
    from benchmarks.memory_model import SHAPES, estimate

    base = work["dtype"] if work["quantization"] == "none" else work["quantization"]
    return estimate(
        SHAPES[work["model"]],
        base=base,
        dtype=work["dtype"],
        lora_r=work["lora_r"],
        rows=work["prompts"] * work["num_generations"],
        prompt_length=work["prompt_length"],
        max_new_tokens=work["max_new_tokens"],
        gradient_checkpointing=work["gradient_checkpointing"],
        distinct_prompts=work["prompts"],
    )


def _error(predicted: float, measured: float) -> str:
    return f"{predicted / measured - 1:+.0%}"


def _row(*cells: str) -> str:
    """One Markdown table row of ``cells``."""
    return "| " + " | ".join(cells) + " |"


def format_tables(results: list[dict[str, Any]]) -> str:
    """Two Markdown tables: the step against the whole model; its resident and transient parts against their terms.

    Measured = step peak RSS − RSS before the model was loaded; resident = RSS at step start − that (in parentheses
    the mapped-file part of the RSS at step start, libraries' code included); transient = step peak − RSS at step
    start, and the same for the sampling and the update phase alone. The model's resident part is weights + adapter
    state, its transient part the larger of the update pass's activations and the sampling pass's cache and logits.
    """
    mib = lambda x: f"{x / MiB:,.0f}"  # noqa: E731
    first = [
        "| base | checkpointing | step s, wall (cpu) | process peak RSS MiB | step peak RSS MiB "
        "| step peak − libraries MiB | model MiB | model error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    second = [
        "| base | checkpointing | resident MiB (mapped files) | model: weights + adapter MiB | error "
        "| step transient MiB | sampling / update phase MiB | model: max(update, sampling) MiB | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        model, ckpt = _estimate(r["workload"]), "on" if r["workload"]["gradient_checkpointing"] else "off"
        measured = r["step_peak_bytes"] - r["libraries_bytes"]
        resident, transient = r["step_start_bytes"] - r["libraries_bytes"], r["step_peak_bytes"] - r["step_start_bytes"]
        states, passes = model.base_linear + model.base_other + model.adapter, max(model.activations, model.generation)
        first.append(
            _row(
                r["label"],
                ckpt,
                f"{r['step_seconds']:.1f} ({r['step_cpu_seconds']:.1f})",
                mib(r["process_peak_bytes"]),
                mib(r["step_peak_bytes"]),
                mib(measured),
                mib(model.total),
                _error(model.total, measured),
            )
        )
        phases = {k: v - r["step_start_bytes"] for k, v in r["phase_peak_bytes"].items()}
        second.append(
            _row(
                r["label"],
                ckpt,
                f"{mib(resident)} ({mib(r['step_start_file_bytes'])})",
                mib(states),
                _error(states, resident),
                mib(transient),
                f"{mib(phases['generate'])} / {mib(phases['update'])}",
                mib(passes),
                _error(passes, transient),
            )
        )
    return "\n".join(first) + "\n\n" + "\n".join(second)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run every case (each in its own process); print the Markdown table; write ``--json``."""
    from benchmarks.models import prepare_model
    from benchmarks.workload import Workload

    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    common = Workload(
        model=args.model,
        prompts=args.prompts,
        num_generations=args.num_generations,
        lora_r=args.lora_r,
        prompt_length=args.prompt_length,
        max_new_tokens=args.max_new_tokens,
        kl_coef=args.kl_coef,
        threads=args.threads,
        steps=1,
        warmup_steps=1,
        device="cpu",
    )
    if args.report is not None:
        results = json.loads(args.report.read_text())["cases"]
        print(format_tables(results))
        return results
    cases = [c for c in CASES if args.cases is None or c[0] in args.cases]
    results = []
    with tempfile.TemporaryDirectory(prefix="grpo-qlora-") as tmp:
        models = {
            dtype: prepare_model(args.model, Path(tmp) / dtype, dtype=Workload(dtype=dtype).torch_dtype)
            for dtype in {dtype for _, dtype, _ in cases}
        }
        for label, dtype, quantization in cases:
            for checkpointing in (False, True):
                work = replace(common, dtype=dtype, quantization=quantization, gradient_checkpointing=checkpointing)
                result = run_case(work, models[dtype], Path(tmp), args.verbose)
                results.append({"label": label, "workload": json.loads(work.to_json()), **result})
                print(f"{label} checkpointing={checkpointing}: {json.dumps(result)}", flush=True)
    print(format_tables(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"command": " ".join(["python -m benchmarks.quantization", *argv]), "cases": results}, indent=2)
        )
    return results


if __name__ == "__main__":
    main()
