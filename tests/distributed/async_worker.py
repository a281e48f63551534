"""2-rank DDP fits with ``async_rollout`` (and without, the reference), each rank sampling ahead in its own thread:
what each rank trained on, its staleness, the threads that sampled, and the adapter at the end."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from lightning_grpo.testing.apart_backend import FrozenCopyBackend
from tests.conftest import make_trainer
from tests.distributed.builders import build_module, fit_data
from tests.distributed.ranks import make_strategy, rank, write_json

PATH = "lightning_grpo.testing.apart_backend.FrozenCopyBackend"


class _Record(Callback):
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        staleness = trainer.callback_metrics.get("rollout/staleness")
        self.steps.append(
            {"prompts": list(batch["prompt"]), "staleness": None if staleness is None else float(staleness)}
        )


def fit(workdir: Path, async_rollout: bool) -> None:
    """4 steps over 2 epochs (2 batches per rank and epoch), with async_rollout on or off."""
    name = "async" if async_rollout else "sync"
    module = build_module(
        backend={"rollout_backend": PATH, "async_rollout": async_rollout},
        corrections={"rollout_correction": "token_truncate"},
    )
    record = _Record()
    trainer = make_trainer(devices=2, strategy=make_strategy("ddp"), max_steps=4, callbacks=[record])
    trainer.fit(module, fit_data())
    backend = getattr(module.rollout_backend, "backend", module.rollout_backend)
    threads = sorted({event[3] for event in backend.events if event[0] == "sample"})
    adapter = {n: p.detach().clone() for n, p in module.policy.named_parameters() if "lora_" in n}
    torch.save(adapter, workdir / f"{name}-rank{rank()}.pt")  # each rank its own: DDP keeps them equal
    write_json(
        workdir / f"{name}-rank{rank()}.json",
        {"steps": record.steps, "threads": threads, "global_step": trainer.global_step},
    )


class FailOnRankOne(FrozenCopyBackend):
    """Rank 1's rollouts sampled ahead fail (a server it cannot reach); rank 0's succeed."""

    def session(self, policy: Any, settings: Any) -> Any:
        session = super().session(policy, settings)
        original = session.sample

        def sample(*args: Any, **kwargs: Any) -> Any:
            if rank() == 1 and threading.current_thread().name == "lightning_grpo-rollout-ahead":
                raise ConnectionError("rank 1 lost its server")
            return original(*args, **kwargs)

        session.sample = sample
        return session


def fail(workdir: Path) -> None:
    """A fit whose rollout ahead fails on rank 1: what each rank raised, and whether it closed and joined."""
    module = build_module(backend={"rollout_backend": f"{__name__}.FailOnRankOne", "async_rollout": True})
    trainer = make_trainer(devices=2, strategy=make_strategy("ddp"), max_steps=4)
    try:
        trainer.fit(module, fit_data())
        raised = None
    except Exception as error:
        raised = f"{type(error).__name__}: {error}"
    events = module.rollout_backend.backend.events
    alive = [t.name for t in threading.enumerate() if t.name == "lightning_grpo-rollout-ahead" and t.is_alive()]
    write_json(
        workdir / f"fail-rank{rank()}.json", {"raised": raised, "closed": events[-1][0] == "close", "alive": alive}
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    try:
        for async_rollout in (False, True):
            fit(Path(sys.argv[1]), async_rollout)
        fail(Path(sys.argv[1]))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
