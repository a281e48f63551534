"""What the out-of-band failure watch costs a healthy step: 2 gloo ranks under DDP, the tiny model, with and without.

``python -m benchmarks.rank_failure_watch [--steps 12] [--repeats 3]`` runs, alternately, a 2-rank DDP fit of the tiny
model with :class:`~lightning_grpo.callbacks.RankFailureWatch` (the default) and with it switched off, and prints the
median iteration time of each (rank 0, the first iteration left out). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_fit(mode: str, steps: int, out: Path) -> None:
    """One rank's fit (run in a child process with torchrun-style variables); rank 0 writes its iteration times."""
    import torch
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
    from lightning_grpo.callbacks import RankFailureWatch
    from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

    class Off(RankFailureWatch):
        """The watch switched off (its presence keeps the module from adding one)."""

        def setup(self, *_: Any, **__: Any) -> None:
            pass

        def on_exception(self, *_: Any, **__: Any) -> None:
            pass

    class Times(Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []
            self.seconds: list[float] = []

        def on_train_batch_start(self, *_: Any) -> None:
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, *_: Any) -> None:
            self.seconds.append(time.perf_counter() - self.starts[-1])

    torch.set_num_threads(1)
    tokenizer = build_tiny_tokenizer()
    module = GRPOModule(
        build_tiny_model(tokenizer),
        [lambda completions, **_: [float(len(c) % 3) for c in completions]],
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling={"num_generations": 4, "max_new_tokens": 8, "max_prompt_length": 16}),
    )
    times = Times()
    callbacks = [times, *([Off()] if mode == "off" else [])]
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(),
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    prompts = [{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)]
    loader = torch.utils.data.DataLoader(
        prompts, batch_size=2, collate_fn=lambda rows: {"prompt": [r["prompt"] for r in rows]}
    )
    trainer.fit(module, train_dataloaders=loader)
    if trainer.global_rank == 0:
        out.write_text(json.dumps(times.seconds))


def _launch(mode: str, steps: int) -> list[float]:
    """Both ranks of one fit; rank 0's iteration times."""
    out = Path(tempfile.mkdtemp()) / "times.json"
    port = _free_port()
    command = [sys.executable, "-m", "benchmarks.rank_failure_watch", "--rank-fit", mode, "--steps", str(steps)]
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "NODE_RANK": "0",
            "LOCAL_RANK": str(rank),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "LG_BENCH_OUT": str(out),
        }
        procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL))
    codes = [proc.wait(timeout=600) for proc in procs]
    if any(codes):
        raise RuntimeError(f"a rank failed: exit codes {codes}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    """Alternate fits with and without the watch; print each mode's median iteration time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank-fit", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_fit:
        _rank_fit(args.rank_fit, args.steps, Path(os.environ["LG_BENCH_OUT"]))
        return
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            seconds[mode] += _launch(mode, args.steps)[1:]
    for mode, values in seconds.items():
        print(f"watch {mode}: median iteration {statistics.median(values) * 1000:.1f} ms over {len(values)} iterations")


if __name__ == "__main__":
    main()
