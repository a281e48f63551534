"""One rank of a multi-process test run: ``python -m tests.distributed.worker STRATEGY WORKDIR SCENARIO...``.

:func:`tests.distributed.launch.run_ranks` starts one such process per rank with torchrun-style variables
(``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so Lightning joins them instead of launching
its own. Each scenario writes its results under ``WORKDIR`` for the test to check; the process group is destroyed
at exit. The builders here also serve the single-process references computed in the test process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule, Rollout
from lightning_grpo.config import AgentConfig, ObjectiveConfig, SamplingConfig, UpdateConfig
from lightning_grpo.distributed import full_adapter_state_dict
from lightning_grpo.rewards import StepRewards, step_reward
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model
from tests.conftest import count_a, make_trainer, prompt_loader, prompt_records
from tests.module.helpers import FixedRolloutModule, fixed_rollout

G = 4  # completions per prompt
PROMPTS_PER_RANK = 2
# Two ranks x 2 prompts x G completions of uneven lengths ("..." = truncated): micro-batches differ in token count.
COMPLETIONS = [
    *["aaaa", "ab", "abcdefgha", "b..."],
    *["a", "aab", "xyzxyzxyz...", "aaaaaaaab"],
    *["ba", "c", "aaxaa", "q"],
    *["abab abab", "zz", "a...", "aaaaaaaaaaaa"],
]
PROMPTS = [p for p in ("1+2=", "3+4=", "5+6=", "7+8=") for _ in range(G)]

#: Settings of the equivalence cases: loss aggregation, micro-batch size, advantage scale, clipping.
EQUIVALENCE_CASES: dict[str, dict[str, Any]] = {
    "token-mean-micro2": {"objective": {"loss_agg_mode": "token-mean"}, "update": {"micro_batch_size": 2}},
    "token-mean-micro4-batch-std": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"micro_batch_size": 4},
        "advantages": {"advantage_scale": "batch"},
    },
    "seq-mean-token-mean-micro2": {
        "objective": {"loss_agg_mode": "seq-mean-token-mean"},
        "update": {"micro_batch_size": 2},
    },
    "seq-mean-token-mean-whole": {
        "objective": {"loss_agg_mode": "seq-mean-token-mean"},
        "update": {"micro_batch_size": None},
    },
    # Clipping normalises away a scale error, but catches a gradient norm taken over one rank's shard only.
    "token-mean-micro2-clipped": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"micro_batch_size": 2, "max_grad_norm": 0.1},
    },
    # Packing (on by default where exact) and token budgets: the ranks' rows need 6 and 5 (17 tokens) or 4 and 3 (26
    # tokens) micro-batches, so the ranks must agree on the count; a padded twin of token-mean-micro2 to compare with.
    "token-mean-micro2-padded": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"micro_batch_size": 2, "packing": False},
    },
    "token-mean-packed-tokens17": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"packing": True, "micro_batch_tokens": 17},
    },
    "seq-mean-token-mean-padded-tokens26": {
        "objective": {"loss_agg_mode": "seq-mean-token-mean"},
        "update": {"packing": False, "micro_batch_tokens": 26, "micro_batch_size": 3},
    },
    # Issue 37's policy losses, two passes (the second off-policy): per-token and per-sequence pieces hold over ranks.
    "sapo-micro2-epochs2": {"objective": {"loss_kind": "sapo"}, "update": {"micro_batch_size": 2, "ppo_epochs": 2}},
    "gmpo-seq-mean-micro2-epochs2": {
        "objective": {"loss_kind": "gmpo", "loss_agg_mode": "seq-mean-token-mean"},
        "update": {"micro_batch_size": 2, "ppo_epochs": 2},
    },
    "dppo_tv-micro2-epochs2": {
        "objective": {"loss_kind": "dppo_tv", "loss_kind_args": {"threshold_low": 0.01, "threshold_high": 0.01}},
        "update": {"micro_batch_size": 2, "ppo_epochs": 2},
    },
    # Issue 38's per-token and per-row pieces (rollout weights, OPSM, importance-weighted KL) and the adaptive entropy
    # control, whose next coefficient comes from the step's global entropy: equal on both ranks and to one process.
    "off-policy-adaptive-micro2": {
        "update": {"micro_batch_size": 2},
        "corrections": {
            "rollout_correction": "token_truncate",
            "rollout_correction_args": {"min": 0.5, "max": 2.0},
            "off_policy_mask": "opsm",
            "off_policy_mask_args": {"threshold": 2.5},
        },
        "objective": {
            "kl_weighting": "importance",
            "entropy_control": "adaptive",
            "entropy_control_args": {"target": 50.0, "delta": 0.01},
        },
    },
    # Process supervision (grpo_process): the batch std of every step reward of the global batch, and an outcome step.
    "process-batch-std-micro2": {
        "update": {"micro_batch_size": 2},
        "advantages": {
            "advantage_estimator": "grpo_process",
            "advantage_scale": "batch",
            "process_outcome_weight": 0.5,
        },
        "reward_funcs": "process",
    },
    # Issue 37's estimators with batch statistics summed over ranks: GDPO's whitening of the per-function sums,
    # REINFORCE++'s token whitening, GPG's alpha (valid rows over rows in groups with a spread).
    "gdpo-micro2": {
        "update": {"micro_batch_size": 2},
        "advantages": {"advantage_estimator": "gdpo"},
        "reward_funcs": "two",
    },
    "reinforce-pp-micro2": {
        "update": {"micro_batch_size": 2},
        "advantages": {"advantage_estimator": "reinforce_plus_plus", "advantage_estimator_args": {"gamma": 0.9}},
    },
    "gpg-micro2": {"update": {"micro_batch_size": 2}, "advantages": {"advantage_estimator": "gpg"}},
}


@step_reward
def a_per_chunk(completions: list[str], **_: Any) -> list[StepRewards]:
    """Steps of three characters (the last may be shorter), each scored by its count of ``a``."""
    starts = lambda c: range(0, len(c), 3)  # noqa: E731
    return [
        StepRewards([c[i : i + 3].count("a") for i in starts(c)], [min(i + 3, len(c)) for i in starts(c)])
        for c in completions
    ]


def count_b(completions: list[str], **_: Any) -> list[float]:
    """The number of ``b`` in each completion (a second reward function, for ``gdpo``)."""
    return [float(c.count("b")) for c in completions]


def rank() -> int:
    """This process's rank (0 outside a launched run)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def make_strategy(name: str, **options: Any) -> Any:
    """``"ddp"``, ``"fsdp"`` (FSDP2 over 2 ranks) or ``"single"`` (one process)."""
    if name == "ddp":
        return DDPStrategy(**options)
    if name == "fsdp":
        return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, **options)
    return "auto"


def world_of(strategy: str) -> int:
    """Processes of a strategy name."""
    return 1 if strategy == "single" else 2


class RankSliceModule(FixedRolloutModule):
    """Trains on this rank's slice of ``self.fixed``: ranks split the rows, groups stay whole."""

    def generate(self, batch: Any, *, num_generations: int | None = None, temperature: float | None = None) -> Rollout:
        n = len(self.fixed) // self.trainer.world_size
        rows = torch.arange(self.global_rank * n, (self.global_rank + 1) * n)
        part = self.fixed.select(rows)
        part.group_ids = part.group_ids - part.group_ids.min()
        return part.to(self.device)


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """``layers`` merged, a later one winning, group by group: ``{"update": {...}, "objective": {...}, ...}``."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = {**out[key], **value} if both else value
    return out


def build_module(
    module_cls: type[GRPOModule] = GRPOModule, *, lr: float = 1e-2, sgd: bool = False, **settings: Any
) -> GRPOModule:
    """A GRPOModule over the tiny model (seed 0), as every rank and the single-process reference build it;
    ``settings``: groups of ``GRPOConfig`` as dicts (``update={"micro_batch_size": 2}``), over the tiny sampling."""
    tokenizer = build_tiny_tokenizer()
    settings = merged({"sampling": {"num_generations": G, "max_new_tokens": 6, "max_prompt_length": 16}}, settings)
    policy = settings.pop("policy", PolicyConfig(lora_r=4, lora_alpha=8))
    scheduler = settings.pop("lr_scheduler", None)
    funcs = {"process": [count_a, a_per_chunk], "two": [count_a, count_b]}
    reward_funcs = funcs.get(settings.pop("reward_funcs", None), [count_a])
    optimizer = torch.optim.SGD if sgd else torch.optim.AdamW
    return module_cls(
        build_tiny_model(tokenizer),
        reward_funcs,
        tokenizer=tokenizer,
        policy=policy,
        grpo=GRPOConfig(**settings),
        optimizer=lambda params: optimizer(params, lr=lr),
        lr_scheduler=scheduler,
    )


def perturb_adapter(module: GRPOModule) -> None:
    """Move the adapter off its zero-B initialisation (seeded), so the KL term and every weight get a gradient."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in module.policy.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def equivalence_case(strategy: str, case: str) -> tuple[GRPOModule, Any]:
    """One SGD step (no clipping) on the injected rollout; the adapter after it must not depend on world size."""
    settings = merged({"objective": {"kl_coef": 0.1}, "update": {"max_grad_norm": None}}, EQUIVALENCE_CASES[case])
    module = build_module(RankSliceModule, lr=0.5, sgd=True, **settings)
    module.fixed = fixed_rollout(module.tokenizer, PROMPTS, COMPLETIONS, group_size=G)
    if settings.get("corrections", {}).get("rollout_correction"):  # behaviour log-probs of a sampler: uneven values
        ids = module.fixed.completion_ids
        module.fixed.logprobs = -1.0 - 0.25 * (ids % 7).float()
    perturb_adapter(module)
    trainer = make_trainer(devices=world_of(strategy), strategy=make_strategy(strategy), max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1="] * world_of(strategy)))
    return module, trainer


def qlora_case(strategy: str) -> GRPOModule:
    """An NF4-quantized base (QLoRA): one SGD step on the injected rollout, as the equivalence cases take it."""
    policy = PolicyConfig(lora_r=4, lora_alpha=8, quantization="nf4", dtype="float32")
    module = build_module(
        RankSliceModule,
        lr=0.5,
        sgd=True,
        objective={"kl_coef": 0.1},
        update={"max_grad_norm": None, "micro_batch_size": 2},
        policy=policy,
    )
    module.fixed = fixed_rollout(module.tokenizer, PROMPTS, COMPLETIONS, group_size=G)
    perturb_adapter(module)
    trainer = make_trainer(devices=world_of(strategy), strategy=make_strategy(strategy), max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1="] * world_of(strategy)))
    return module


def scenario_qlora(strategy: str, workdir: Path) -> None:
    """:func:`qlora_case` on every rank; each rank writes its adapter (DDP keeps them equal)."""
    module = qlora_case(strategy)
    adapter = {n: p.detach().cpu() for n, p in module.policy.named_parameters() if p.requires_grad}
    torch.save(adapter, workdir / f"qlora-rank{rank()}.pt")


def save_adapter(module: GRPOModule, path: Path) -> None:
    """Gather the adapter (every rank calls) and save it on rank zero."""
    state = full_adapter_state_dict(module.policy)
    if rank() == 0:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, path)


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON."""
    path.write_text(json.dumps(value, indent=1))


def scenario_equivalence(strategy: str, workdir: Path) -> None:
    """Every equivalence case (adapter and logged metrics); plus a check that ``_sum_across_ranks`` sums."""
    metrics = {}
    for case in EQUIVALENCE_CASES:
        module, trainer = equivalence_case(strategy, case)
        save_adapter(module, workdir / f"{case}.pt")
        metrics[case] = {**logged(trainer), "entropy_coef_next": module.entropy_coef}
    summed = module._sum_across_ranks(torch.tensor([rank() + 1.0]))
    write_json(workdir / f"equivalence-rank{rank()}.json", {"summed": float(summed), "metrics": metrics})


def logged(trainer: Any) -> dict[str, float]:
    """The trainer's logged metrics as floats."""
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


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


def _step_lr(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def fit_module() -> GRPOModule:
    """Sampling, KL, several optimizer steps per rollout, clipping, gradient checkpointing, a scheduler."""
    return build_module(
        policy=PolicyConfig(lora_r=4, lora_alpha=8, gradient_checkpointing=True),
        objective={"kl_coef": 0.01},
        update={"ppo_epochs": 2, "mini_batch_size": 4, "micro_batch_size": 2},
        lr_scheduler=_step_lr,
    )


def fit_data() -> PromptDataModule:
    """8 prompts in batches of 2: 2 batches per rank and epoch on 2 ranks."""
    return PromptDataModule(prompt_records(8), batch_size=2, seed=1)


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
        devices=world, strategy=make_strategy(strategy, **options), max_steps=4, enable_checkpointing=True,
        callbacks=[checkpoint],
    )  # fmt: skip
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
        short_turn_model(tokenizer), [_env_score], tokenizer=tokenizer, policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=grpo,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2), environment_factory=_rank_countdown,
    )  # fmt: skip


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


def scenario_rewards(strategy: str, workdir: Path) -> None:
    """A reward model and dynamic sampling (see :mod:`tests.distributed.rewards_scenario`)."""
    from tests.distributed.rewards_scenario import scenario_rewards as run

    run(strategy, workdir)


SCENARIOS = {
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
