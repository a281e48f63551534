"""2-rank DDP fits with ``async_rollout`` (and without, the reference), each rank sampling ahead in its own thread:
what each rank trained on, its staleness, the threads that sampled, and the adapter at the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from tests.conftest import make_trainer
from tests.distributed.worker import build_module, fit_data, make_strategy, rank, write_json

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
    module = build_module(rollout_backend=PATH, async_rollout=async_rollout, rollout_correction="token_truncate")
    record = _Record()
    trainer = make_trainer(devices=2, strategy=make_strategy("ddp"), max_steps=4, callbacks=[record])
    trainer.fit(module, fit_data())
    backend = getattr(module.rollout_backend, "backend", module.rollout_backend)
    threads = sorted({event[3] for event in backend.events if event[0] == "sample"})
    adapter = {n: p.detach().clone() for n, p in module.policy.named_parameters() if "lora_" in n}
    torch.save(adapter, workdir / f"{name}-rank{rank()}.pt")  # each rank its own: DDP keeps them equal
    write_json(workdir / f"{name}-rank{rank()}.json", {"steps": record.steps, "threads": threads,
                                                       "global_step": trainer.global_step})  # fmt: skip


if __name__ == "__main__":
    torch.set_num_threads(1)
    try:
        for async_rollout in (False, True):
            fit(Path(sys.argv[1]), async_rollout)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
