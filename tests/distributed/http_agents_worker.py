"""One rank of the HTTP-agent run: ``python -m tests.distributed.http_agents_worker STRATEGY WORKDIR``.

Under DDP each rank trains ``agent=`` over its own loopback server on its own rows; rank 1's agents edit their
history (2 rows per trajectory) and rank 0's do not (1 row), so the ranks hold 8 and 16 rows: 2 and 4 mini-batches
of 4, and rank 0 must run 2 idle ones for DDP's gradient all-reduces to pair up. Under FSDP2 ``agent=`` is refused.
Each rank writes what it saw for ``test_http_agents.py``.
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.config import AgentConfig, ObjectiveConfig, SamplingConfig, UpdateConfig
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import short_turn_model
from tests.conftest import make_trainer
from tests.distributed.builders import G
from tests.distributed.ranks import make_strategy, rank, write_json

URLS: list[str] = []


async def agent(client: Any, row: dict[str, Any]) -> float:
    """One call; on rank 1 a second call with an edited history (a second row of the trajectory)."""
    URLS.append(str(client.base_url))
    reply = await client.chat.completions.create(model="policy", messages=row["prompt"])
    content = reply.choices[0].message.content or ""
    if rank() == 1:
        edited = [*row["prompt"], {"role": "assistant", "content": content + "!"}, {"role": "user", "content": "?"}]
        await client.chat.completions.create(model="policy", messages=edited)
    return float(len(content) % 3)


class RowRecorder(Callback):
    """Rows of every training rollout of this rank."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.rows.append(len(outputs["rollout"]))


def module() -> GRPOModule:
    tokenizer = build_tiny_tokenizer()
    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=G, max_new_tokens=12, max_prompt_length=64),
        objective=ObjectiveConfig(kl_coef=0.0),
        update=UpdateConfig(mini_batch_size=4, micro_batch_size=2),
        agents=AgentConfig(agent_transport="http"),
    )
    return GRPOModule(
        short_turn_model(tokenizer),
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=grpo,
        agent=agent,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )


def data() -> PromptDataModule:
    rows = [{"prompt": [{"role": "user", "content": f"question {i}"}]} for i in range(8)]
    return PromptDataModule(rows, batch_size=2, seed=1)


def _listening(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def scenario_ddp(workdir: Path) -> None:
    recorder, threads = RowRecorder(), threading.active_count()
    trained = module()
    trainer = make_trainer(devices=2, strategy=make_strategy("ddp"), max_steps=8, callbacks=[recorder])
    trainer.fit(trained, data())
    adapter = {n: p.detach().clone() for n, p in trained.policy.named_parameters() if p.requires_grad}
    torch.save(adapter, workdir / f"adapter-rank{rank()}.pt")
    ports = sorted({url.rsplit(":", 1)[1].split("/")[0] for url in URLS})
    optimizer = trained.optimizers().optimizer
    write_json(
        workdir / f"ddp-rank{rank()}.json",
        {
            "rows": recorder.rows,
            "ports": ports,
            "listening": [url for url in set(URLS) if _listening(url)],
            "threads_before": threads,
            "threads_after": threading.active_count(),
            "optimizer_steps": optimizer.state[next(iter(optimizer.state))]["step"].item(),
        },
    )


def scenario_fsdp(workdir: Path) -> None:
    trainer = make_trainer(devices=2, strategy=make_strategy("fsdp"), max_steps=1)
    try:
        trainer.fit(module(), data())
        message = ""
    except ValueError as error:
        message = str(error)
    write_json(workdir / f"fsdp-rank{rank()}.json", {"message": message})


def main(argv: list[str]) -> None:
    """Run the scenario of strategy ``argv[0]``, writing into ``argv[1]``; then leave the group."""
    strategy, workdir = argv
    torch.set_num_threads(1)
    try:
        (scenario_ddp if strategy == "ddp" else scenario_fsdp)(Path(workdir))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
