"""One rank of the rank-failure run: ``python -m tests.distributed.rank_failures_worker WORKDIR SCENARIO...``.

Under DDP on 2 gloo ranks, one rank alone meets a problem in its rollout; the other samples normally:

* ``no-call``: rank 0's agents (here rank 0's, whose callbacks alone log samples) return without a chat call: the
  step completes, rank 0 with an empty batch.
* ``agent-raises``: rank 1's agents raise before any call.
* ``env-raises``: rank 1's environment raises in ``step`` (``env-raises-fsdp``: under FSDP2, whose turn loop asks the
  ranks before each turn whether any still samples).
* ``mcp-dies``: rank 1's policy calls the MCP tool ``die``, which ends its (``on_exit="stop"``) tool server.

Each rank writes ``SCENARIO-rankR.json``: what it trained, or the error ``trainer.fit`` raised; after an error it
waits for the other rank's file before going on, and records whether it came (both ranks still running).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.agents import EnvStep, ParsedTurn, ToolCall
from lightning_grpo.config import AgentConfig, FaultConfig, ObjectiveConfig, SamplingConfig
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model
from tests.conftest import make_trainer
from tests.distributed.ranks import make_strategy, rank, write_json

MCP_SERVER = [sys.executable, str(Path(__file__).with_name("mcp_die_server.py"))]
PEER_WAIT = 60.0  # seconds a rank waits for the other's error file


async def calling_agent(client: Any, row: dict[str, Any]) -> float:
    """One chat call on rank 1; on rank 0 no call at all (a reward without a trajectory)."""
    if rank() == 0:
        return 1.0
    reply = await client.chat.completions.create(model="policy", messages=row["prompt"])
    return float(len(reply.choices[0].message.content or "") % 3)


async def raising_agent(client: Any, row: dict[str, Any]) -> float:
    """One chat call on rank 0; on rank 1 an error before any call."""
    if rank() == 1:
        raise ValueError("agent boom on rank 1")
    reply = await client.chat.completions.create(model="policy", messages=row["prompt"])
    return float(len(reply.choices[0].message.content or "") % 3)


class RaisingEnv(CountdownEnv):
    """A two-turn countdown whose ``step`` raises on rank 1."""

    def step(self, message: dict[str, Any]) -> EnvStep:
        if rank() == 1:
            raise RuntimeError("environment step failed on rank 1")
        return super().step(message)


class DieParser:
    """Rank 1's turns call the MCP tool ``die`` (its server exits); rank 0's turns call nothing."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, tool_calls=[ToolCall("die", {})] if rank() == 1 else [])


def length_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    return [float(len(str(c)) % 3) for c in completions]


class Recorder(Callback):
    """Rows of every training rollout of this rank."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.rows.append(len(outputs["rollout"]))


def module(prompt_length: int = 64, **options: Any) -> GRPOModule:
    tokenizer = build_tiny_tokenizer()
    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=2, max_new_tokens=8, max_prompt_length=prompt_length),
        objective=ObjectiveConfig(kl_coef=0.0),
        agents=AgentConfig(max_turns=2, agent_timeout=30.0),
        faults=FaultConfig(collective_timeout_s=60.0),
    )
    return GRPOModule(
        short_turn_model(tokenizer),
        options.pop("reward_funcs", None),
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=grpo,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
        **options,
    )


def raising_env(row: dict[str, Any]) -> RaisingEnv:
    return RaisingEnv({"turns": 2})


def modules() -> dict[str, Any]:
    die_server = {"command": MCP_SERVER, "on_exit": "stop"}
    return {
        "no-call": lambda: module(agent=calling_agent),
        "agent-raises": lambda: module(agent=raising_agent),
        "env-raises": lambda: module(reward_funcs=[length_reward], environment_factory=raising_env),
        "env-raises-fsdp": lambda: module(reward_funcs=[length_reward], environment_factory=raising_env),
        "mcp-dies": lambda: module(400, reward_funcs=[length_reward], tool_parser=DieParser(), tools=[die_server]),
    }


def data() -> PromptDataModule:
    rows = [{"prompt": [{"role": "user", "content": f"question {i}"}]} for i in range(4)]
    return PromptDataModule(rows, batch_size=1, seed=1)


def run(name: str, workdir: Path) -> None:
    recorder, trained = Recorder(), modules()[name]()
    strategy = make_strategy("fsdp" if name.endswith("-fsdp") else "ddp")
    trainer = make_trainer(devices=2, strategy=strategy, max_steps=1, callbacks=[recorder])
    try:
        trainer.fit(trained, data())
    except Exception as error:  # every rank must get the error, with the failing rank's cause
        traceback.print_exc()  # into the rank's log
        result = {
            "error": type(error).__name__,
            "message": str(error),
            "time": time.time(),
            "cause": None if error.__cause__ is None else type(error.__cause__).__name__,
        }
        write_json(workdir / f"{name}-rank{rank()}.json", result)
        result["peer"] = _peer(workdir / f"{name}-rank{1 - rank()}.json")  # both ranks still run: no exit yet
        write_json(workdir / f"{name}-rank{rank()}.json", result)
        return
    backend = torch.distributed.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    adapter = {n: p.detach().clone() for n, p in trained.policy.named_parameters() if p.requires_grad}
    torch.save(adapter, workdir / f"{name}-adapter-rank{rank()}.pt")
    optimizer = trained.optimizers().optimizer
    write_json(
        workdir / f"{name}-rank{rank()}.json",
        {
            "rows": recorder.rows,
            "global_step": trainer.global_step,
            "optimizer_steps": optimizer.state[next(iter(optimizer.state))]["step"].item(),
            "timeout_s": backend.options._timeout.total_seconds(),
        },
    )


def _peer(path: Path) -> dict[str, Any] | None:
    """The other rank's error file, once it is written (``None`` after :data:`PEER_WAIT` seconds)."""
    deadline = time.monotonic() + PEER_WAIT
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return {key: value for key, value in json.loads(path.read_text()).items() if key != "peer"}
            except json.JSONDecodeError:  # being written
                pass
        time.sleep(0.1)
    return None


def main(argv: list[str]) -> None:
    """Run the scenarios ``argv[1:]``, writing into ``argv[0]``; then leave the group."""
    workdir, *scenarios = argv
    torch.set_num_threads(1)
    try:
        for name in scenarios:
            run(name, Path(workdir))
            print(f"rank {rank()}: scenario {name} done", flush=True)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
