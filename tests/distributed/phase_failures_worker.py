"""One rank of the phase-failure run: ``python -m tests.distributed.phase_failures_worker WORKDIR NAME:PORT...``.

Each scenario makes one phase of a GRPO iteration raise on one rank only (an injection through a patched function),
while the other rank runs normally and ends up waiting in a collective of that phase or the next. Outside the rollout
nothing votes: the failure must reach the other rank out of band (:class:`~lightning_grpo.callbacks.RankFailureWatch`).

The rank imports once, then forks one child per scenario (a process group of its own, on the scenario's port: a rank
that fails leaves its group). The child writes ``NAME-rankR.json`` (the error ``trainer.fit`` raised, its message and
causes, the start and end times) and exits; the parent waits at most ``CHILD_WAIT_S`` for it (a hang is recorded).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.backends.hf import HFBackend, HFSession
from lightning_grpo.callbacks import AdapterExport, GroupRewardStats, SampleLogger
from lightning_grpo.checkpoint.records import CheckedCheckpointIO
from lightning_grpo.iteration import update as update_module
from lightning_grpo.rewards import RewardFunctions, RewardModel
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.conftest import make_trainer
from tests.distributed.builders import build_module, count_a, fit_data
from tests.distributed.ranks import make_strategy, rank, write_json
from tests.distributed.rewards_scenario import classifier

CHILD_WAIT_S = 75.0  # a child still running after this is a hang
FAULTS = {"collective_timeout_s": 45.0}  # bounds a hang if the mechanism failed


def boom(where: str, kind: type[BaseException] = ValueError) -> Any:
    """A function that raises ``kind("<where> boom on rank R")``."""

    def raising(*_: Any, **__: Any) -> Any:
        raise kind(f"{where} boom on rank {rank()}")

    return raising


def broken_reward(*_: Any, **__: Any) -> Any:
    """Scoring whose reward server is down."""
    raise ConnectionError("reward server http://127.0.0.1:9/score refused the connection")


def fail_in_a_sampling_forward(module: GRPOModule) -> None:
    """The policy's third forward without gradients (a decode step of the first rollout) raises."""
    calls = []

    def hook(*_: Any) -> None:
        if not torch.is_grad_enabled():
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError(f"sampling forward boom on rank {rank()}")

    module.policy.register_forward_pre_hook(hook)


def with_reward_model(**settings: Any) -> GRPOModule:
    """The tiny module scored by a counting function and a tiny reward model."""
    tokenizer = build_tiny_tokenizer()
    reward_model = RewardModel(classifier(), tokenizer, name="tiny-rm", batch_size=2)
    sampling = {"max_prompt_length": 16, **settings.pop("sampling")}
    return GRPOModule(
        build_tiny_model(tokenizer),
        {"count": count_a, "tiny-rm": reward_model},
        tokenizer=tokenizer,
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling=sampling, **settings),
    )


def _on(failing: int, target: Any, name: str, replacement: Any) -> None:
    if rank() == failing:
        setattr(target, name, replacement)


def inject(name: str) -> dict[str, Any]:
    """Install scenario ``name``'s failure on its rank; what the fit needs beside (trainer options, module settings)."""
    phase = name.removesuffix("-fsdp")
    extra: dict[str, Any] = {"trainer": {}, "module": {}, "after_build": lambda module: None}
    if phase == "sync":
        _on(1, HFBackend, "sync", boom("sync", RuntimeError))
    elif phase == "score":
        _on(1, RewardFunctions, "__call__", broken_reward)
    elif phase == "advantages":
        _on(1, GRPOModule, "compute_advantages", boom("advantages"))
    elif phase == "logprobs":
        original = GRPOModule.compute_logprobs

        def reference_fails(self: GRPOModule, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("reference"):
                raise RuntimeError(f"reference pass boom on rank {rank()}")
            return original(self, *args, **kwargs)

        _on(1, GRPOModule, "compute_logprobs", reference_fails)
        extra["module"]["objective"] = {"kl_coef": 0.1}
    elif phase == "update":
        _on(1, GRPOModule, "compute_loss", boom("loss"))
    elif phase == "guard":
        _on(1, update_module, "nonfinite_flags", boom("guard"))
    elif name == "checkpoint-fsdp":  # FSDP2 saves through distributed checkpointing, every rank writing its shard
        _on(1, GRPOModule, "on_save_checkpoint", boom("checkpoint state"))
        extra["trainer"] = {"enable_checkpointing": True, "callbacks": [ModelCheckpoint(every_n_train_steps=1)]}
    elif phase == "checkpoint":
        _on(0, CheckedCheckpointIO, "save_checkpoint", boom("disk", OSError))
        extra["trainer"] = {"enable_checkpointing": True, "callbacks": [ModelCheckpoint(every_n_train_steps=1)]}
    elif name == "export-fsdp":  # every rank gathers the sharded adapter
        _on(1, GRPOModule, "export_adapter", boom("export", RuntimeError))
        extra["trainer"] = {"callbacks": [AdapterExport(every_n_iterations=1)]}
    elif phase == "export":
        _on(0, GRPOModule, "export_adapter", boom("export", RuntimeError))
        extra["trainer"] = {"callbacks": [AdapterExport(every_n_iterations=1)]}
    elif phase == "callback":
        _on(0, SampleLogger, "on_train_batch_end", boom("SampleLogger"))
        _on(1, GroupRewardStats, "on_train_batch_end", boom("GroupRewardStats"))
    elif name == "sampling-fsdp" and rank() == 1:  # inside a forward every rank joins: no vote can pair
        extra["after_build"] = fail_in_a_sampling_forward
    elif phase == "sampling":  # DDP: the rollout's vote agrees on it (the watch lets the agreed error pass)
        _on(1, HFSession, "sample", boom("sampling"))
    elif phase == "reward-model":
        _on(1, RewardModel, "__call__", boom("reward model", torch.OutOfMemoryError))
        extra["module"]["reward_funcs"] = "with-model"
    elif phase == "killed":
        _on(1, RewardFunctions, "__call__", lambda *_, **__: os._exit(1))
    return extra


def run(name: str, workdir: Path) -> None:
    """Fit two iterations under scenario ``name`` (its failure injected); raises what ``trainer.fit`` raises."""
    extra = inject(name)
    settings = {"sampling": {"num_generations": 2, "max_new_tokens": 4}, "faults": FAULTS, **extra["module"]}
    module = with_reward_model(**settings) if settings.pop("reward_funcs", None) == "with-model" else None
    module = module or build_module(**settings)
    extra["after_build"](module)
    gpu = os.environ.get("PHASE_ACCELERATOR") == "gpu"  # NCCL: tests/gpu/test_rank_failure_nccl.py
    trainer = make_trainer(
        accelerator="gpu" if gpu else "cpu",
        strategy=make_strategy("fsdp" if name.endswith("-fsdp") else "ddp"),
        devices=2,
        max_steps=2,
        default_root_dir=str(workdir / name),
        **extra["trainer"],
    )
    trainer.fit(module, datamodule=fit_data())


def child(name: str, workdir: Path) -> None:
    """The scenario's process: fit, write what happened, exit without running the parent's exit handlers."""
    torch.set_num_threads(1)
    start = time.time()
    result: dict[str, Any] = {"scenario": name, "rank": rank(), "start": start, "error": None}
    try:
        run(name, workdir)
    except BaseException as error:  # what a user's script would see
        result.update(error=type(error).__name__, message=str(error), causes=getattr(error, "causes", None))
    result["end"] = time.time()
    write_json(workdir / f"{name}-rank{rank()}.json", result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def wait(pid: int, name: str, workdir: Path) -> None:
    """Wait for the child ``pid``; a hang is killed and recorded."""
    deadline = time.monotonic() + CHILD_WAIT_S
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    write_json(workdir / f"{name}-rank{rank()}.json", {"scenario": name, "rank": rank(), "error": "hung"})


def main(argv: list[str]) -> None:
    """Run each ``NAME:PORT`` of ``argv[1:]`` in a child of its own, writing into ``argv[0]``."""
    workdir = Path(argv[0])
    for item in argv[1:]:
        name, port = item.rsplit(":", 1)
        os.environ["MASTER_PORT"] = port
        pid = os.fork()
        if pid == 0:
            child(name, workdir)
        wait(pid, name, workdir)
        print(f"rank {rank()}: scenario {name} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
