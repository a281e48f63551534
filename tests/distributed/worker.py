"""One rank of a multi-process test run: ``python -m tests.distributed.worker STRATEGY WORKDIR SCENARIO...``.

:func:`tests.distributed.launch.run_ranks` starts one such process per rank with torchrun-style variables
(``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so Lightning joins them instead of launching
its own. Each scenario writes its results under ``WORKDIR`` for the test to check; the process group is destroyed
at exit. The modules come from :mod:`tests.distributed.builders` and :mod:`tests.distributed.equivalence_cases`,
which also serve the single-process references computed in the test process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.config import AgentConfig, ObjectiveConfig, SamplingConfig, UpdateConfig
from lightning_grpo.distributed import full_adapter_state_dict
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model
from tests.conftest import make_trainer, prompt_records
from tests.distributed.builders import G, build_module, fit_data, fit_module
from tests.distributed.equivalence_cases import EQUIVALENCE_CASES, equivalence_case, qlora_case
from tests.distributed.ranks import logged, make_strategy, rank, save_adapter, world_of, write_json
from tests.distributed.rewards_scenario import scenario_rewards


def scenario_qlora(strategy: str, workdir: Path) -> None:
    """:func:`qlora_case` on every rank; each rank writes its adapter (DDP keeps them equal)."""
    module = qlora_case(strategy)
    adapter = {n: p.detach().cpu() for n, p in module.policy.named_parameters() if p.requires_grad}
    torch.save(adapter, workdir / f"qlora-rank{rank()}.pt")


def scenario_equivalence(strategy: str, workdir: Path) -> None:
    """Every equivalence case (adapter and logged metrics); plus a check that ``_sum_across_ranks`` sums."""
    metrics = {}
    for case in EQUIVALENCE_CASES:
        module, trainer = equivalence_case(strategy, case)
        save_adapter(module, workdir / f"{case}.pt")
        metrics[case] = {**logged(trainer), "entropy_coef_next": module.entropy_coef}
    summed = module._sum_across_ranks(torch.tensor([rank() + 1.0]))
    write_json(workdir / f"equivalence-rank{rank()}.json", {"summed": float(summed), "metrics": metrics})


class PromptRecorder(Callback):
    """Records, per training batch of this rank, its prompts, completions and completion width (tokens)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        rollout = outputs["rollout"]
        self.batches.append(
            {
                "epoch": trainer.current_epoch,
                "prompts": list(batch["prompt"]),
                "completions": rollout.completions,
                "width": rollout.completion_ids.shape[1],
            }
        )


def scenario_fit(strategy: str, workdir: Path) -> None:
    """Train 3 iterations straight; train 1, checkpoint, resume to 3; export the adapter."""
    world, straight, recorder = world_of(strategy), fit_module(), PromptRecorder()
    trainer = make_trainer(devices=world, strategy=make_strategy(strategy), max_steps=12, callbacks=[recorder])
    trainer.fit(straight, fit_data())  # 3 iterations x (2 ppo_epochs x 8 completions / mini-batch 4) steps
    save_adapter(straight, workdir / "straight.pt")
    if straight.export_adapter_all_ranks or rank() == 0:
        straight.export_adapter(workdir / "adapter")
    write_json(workdir / f"fit-rank{rank()}.json", {"batches": recorder.batches, "global_step": trainer.global_step})

    resume(strategy, workdir, "resumed")


def resume(strategy: str, workdir: Path, name: str, **options: Any) -> None:
    """Train 1 iteration and checkpoint it (in ``workdir/name``), then resume to 3 from the checkpoint."""
    world, directory = world_of(strategy), workdir / name
    checkpoint = ModelCheckpoint(dirpath=directory, save_last=True, every_n_train_steps=4)
    first = make_trainer(
        devices=world,
        strategy=make_strategy(strategy, **options),
        max_steps=4,
        enable_checkpointing=True,
        callbacks=[checkpoint],
    )
    first.fit(fit_module(), fit_data())
    resumed = fit_module()
    trainer = make_trainer(devices=world, strategy=make_strategy(strategy, **options), max_steps=12)
    trainer.fit(resumed, fit_data(), ckpt_path=directory / "last.ckpt")
    save_adapter(resumed, workdir / f"{name}.pt")
    lr = resumed.optimizers().optimizer.param_groups[0]["lr"]
    write_json(workdir / f"{name}-rank{rank()}.json", {"global_step": trainer.global_step, "lr": lr})


def scenario_resume_full(strategy: str, workdir: Path) -> None:
    """FSDP2 with ``save_distributed_checkpoint=False``: one checkpoint file gathered on rank zero."""
    resume(strategy, workdir, "resumed-full", save_distributed_checkpoint=False)


def scenario_uneven(strategy: str, workdir: Path) -> None:
    """Ranks sample different lengths (2 vs 12 new tokens) with and without gathered weights; nothing may hang."""
    results = {}
    for gather in (True, False):
        module = build_module(
            sampling={"max_new_tokens": 2 if rank() == 0 else 12, "fsdp_gather_for_generation": gather}
        )
        recorder = PromptRecorder()
        trainer = make_trainer(devices=2, strategy=make_strategy(strategy), max_steps=2, callbacks=[recorder])
        trainer.fit(module, fit_data())
        results[str(gather)] = recorder.batches
    write_json(workdir / f"uneven-rank{rank()}.json", results)


def scenario_bf16(strategy: str, workdir: Path) -> None:
    """bfloat16 base weights with the float32 adapter in the same FSDP2 units, gradient checkpointing on."""
    policy = PolicyConfig(lora_r=4, lora_alpha=8, dtype="bfloat16", gradient_checkpointing=True)
    module = build_module(policy=policy, update={"micro_batch_size": 4})
    before = full_adapter_state_dict(module.policy)
    trainer = make_trainer(devices=2, strategy=make_strategy(strategy), max_steps=2)
    trainer.fit(module, fit_data())
    after = full_adapter_state_dict(module.policy)
    dtypes = sorted({str(p.dtype) for p in module.policy.parameters()})
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    loss = float(trainer.callback_metrics["train/loss"])
    write_json(workdir / f"bf16-rank{rank()}.json", {"dtypes": dtypes, "moved": moved, "loss": loss})


def scenario_tensor_parallel_refused(strategy: str, workdir: Path) -> None:
    """``ModelParallelStrategy()`` with its defaults puts both devices in tensor parallelism: refused at setup."""
    trainer = make_trainer(devices=2, strategy=ModelParallelStrategy(), max_steps=1)
    try:
        trainer.fit(build_module(), fit_data())
        message = ""
    except ValueError as error:
        message = str(error)
    write_json(workdir / f"refused-rank{rank()}.json", {"message": message})


def _rank_countdown(row: dict[str, Any]) -> CountdownEnv:
    """Episodes of 1 turn on rank 0 and 3 turns on rank 1: ranks run different numbers of sampling calls."""
    return CountdownEnv({"turns": 1 if rank() == 0 else 3})


def _env_score(prompts: list, completions: list, env_reward: list, **_: Any) -> list[float]:
    return [float(r) for r in env_reward]


def agent_module() -> GRPOModule:
    """A multi-turn policy (conversational prompts, an environment) with KL and several optimizer steps per rollout."""
    tokenizer = build_tiny_tokenizer()
    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=G, max_new_tokens=40, max_prompt_length=32),
        agents=AgentConfig(max_turns=3),
        objective=ObjectiveConfig(kl_coef=0.01),
        update=UpdateConfig(mini_batch_size=4, micro_batch_size=2),
    )
    return GRPOModule(
        short_turn_model(tokenizer),
        [_env_score],
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=grpo,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
        environment_factory=_rank_countdown,
    )


def agent_data() -> PromptDataModule:
    """8 conversational prompts in batches of 2."""
    rows = [{"prompt": [{"role": "user", "content": record["prompt"]}]} for record in prompt_records(8)]
    return PromptDataModule(rows, batch_size=2, seed=1)


class TurnRecorder(Callback):
    """Records the turns per trajectory of every training batch of this rank, and whether it keeps the turn cache."""

    def __init__(self) -> None:
        self.turns, self.turn_cache = list[list[int]](), list[bool]()  # turn_cache: the default, on this strategy

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.turns.append(outputs["rollout"].turns.num_turns.tolist())
        self.turn_cache.append(pl_module.rollout_backend.turn_cache_for(pl_module.sampling_settings()))


def scenario_agents(strategy: str, workdir: Path) -> None:
    """Multi-turn trajectories with 1 turn on rank 0 and 3 on rank 1: 2 iterations straight, then 1 + resume to 2."""
    world, recorder = world_of(strategy), TurnRecorder()
    trainer = make_trainer(devices=world, strategy=make_strategy(strategy), max_steps=4, callbacks=[recorder])
    straight = agent_module()
    trainer.fit(straight, agent_data())
    save_adapter(straight, workdir / "agents-straight.pt")
    checkpoint = ModelCheckpoint(dirpath=workdir / "agents-ckpt", save_last=True, every_n_train_steps=2)
    first = make_trainer(
        devices=world, strategy=make_strategy(strategy), max_steps=2, enable_checkpointing=True, callbacks=[checkpoint]
    )
    first.fit(agent_module(), agent_data())
    resumed = agent_module()
    make_trainer(devices=world, strategy=make_strategy(strategy), max_steps=4).fit(
        resumed, agent_data(), ckpt_path=workdir / "agents-ckpt" / "last.ckpt"
    )
    save_adapter(resumed, workdir / "agents-resumed.pt")
    write_json(workdir / f"agents-rank{rank()}.json", {"turns": recorder.turns, "turn_cache": recorder.turn_cache})


def scenario_logged(strategy: str, workdir: Path) -> None:
    """One iteration as the CLI runs it: a CSV logger, the default callbacks and an adapter export into the logger's
    folder (those read the run folder on rank zero alone: no collective there)."""
    from lightning.pytorch.loggers import CSVLogger

    from lightning_grpo.callbacks import AdapterExport

    logger = CSVLogger(save_dir=str(workdir / "logged"), name="run")
    trainer = make_trainer(
        devices=world_of(strategy), strategy=make_strategy(strategy), max_steps=4, logger=logger,
        callbacks=[AdapterExport()], default_root_dir=str(workdir / "logged"), log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(fit_module(), fit_data())
    write_json(workdir / f"logged-rank{rank()}.json", {"global_step": trainer.global_step})


SCENARIOS = {
    "logged": scenario_logged,
    "agents": scenario_agents,
    "rewards": scenario_rewards,
    "equivalence": scenario_equivalence,
    "fit": scenario_fit,
    "resume-full": scenario_resume_full,
    "uneven": scenario_uneven,
    "bf16": scenario_bf16,
    "tp-refused": scenario_tensor_parallel_refused,
    "qlora": scenario_qlora,
}


def main(argv: list[str]) -> None:
    """Run the scenarios ``argv[2:]`` with strategy ``argv[0]``, writing into ``argv[1]``; then leave the group."""
    strategy, workdir, *scenarios = argv
    torch.set_num_threads(1)
    try:
        for name in scenarios:
            SCENARIOS[name](strategy, Path(workdir))
            print(f"rank {rank()}: scenario {name} done", flush=True)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
