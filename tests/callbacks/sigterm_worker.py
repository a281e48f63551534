"""One rank of a 2-rank DDP run (gloo, CPU) that a test stops with SIGTERM, as a scheduler preempting the job does.

``python -m tests.callbacks.sigterm_worker <workdir>``: writes ``<workdir>/started-<rank>`` once training runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback
from lightning.pytorch.strategies import DDPStrategy

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.callbacks import SaveOnInterrupt
from lightning_grpo.config import SamplingConfig
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.conftest import count_a, make_trainer, prompt_loader


class Started(Callback):
    """Marks that a step completed, so the test knows when to send the signal."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        (self.workdir / f"started-{trainer.global_rank}").write_text(str(trainer.global_step))


def main(workdir: Path) -> None:
    torch.set_num_threads(1)
    tokenizer = build_tiny_tokenizer()
    module = GRPOModule(
        build_tiny_model(tokenizer), [count_a], tokenizer=tokenizer, policy=PolicyConfig(lora_r=2, lora_alpha=4),
        grpo=GRPOConfig(sampling=SamplingConfig(num_generations=2, max_new_tokens=4, max_prompt_length=8)),
        default_callbacks=False,
    )  # fmt: skip
    callbacks = [Started(workdir), SaveOnInterrupt(dirpath=workdir / "ckpt")]
    strategy = DDPStrategy(process_group_backend="gloo")
    trainer = make_trainer(devices=2, strategy=strategy, max_steps=100000, callbacks=callbacks)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="], repeat=100000))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
