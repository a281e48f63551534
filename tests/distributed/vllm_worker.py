"""A rank of the 2-process vLLM runs: ``python -m tests.distributed.vllm_worker {ddp|fsdp} WORKDIR``.

Each rank builds its own colocated engine for its own prompts (TRL's colocate mode), fits two iterations and writes
what the test checks: its rollouts, the log-prob agreement of each step, and its adapter after the fit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch

from tests.backends.vllm_helpers import PROMPTS, loader, vllm_module
from tests.distributed.ranks import make_strategy, rank


def main(strategy: str, workdir: Path) -> None:
    torch.set_num_threads(1)
    module, seen, adapter = vllm_module(), [], {}
    record = L.pytorch.callbacks.LambdaCallback(
        on_train_batch_end=lambda t, m, out, *_: seen.append(out),
        on_train_end=lambda t, m: adapter.update(_adapter(m)),  # the process group is still there
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=make_strategy(strategy),
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
    )
    trainer.fit(module, loader(PROMPTS, repeat=8))  # the distributed sampler gives each rank its own prompts
    result = {
        "prompts": [out["rollout"].prompts for out in seen],
        "completions": [out["rollout"].completion_ids.tolist() for out in seen],
        "diff_max": [float(out["metrics"]["rollout_logprob_diff_max"]) for out in seen],
        "sync": [out["timings"]["sync"] for out in seen],
        "engine_closed": module.rollout_backend.engine is None,
        "adapter": adapter,
    }
    (workdir / f"vllm-{strategy}-rank{rank()}.json").write_text(json.dumps(result))


def _adapter(module) -> dict[str, float]:
    """A checksum of each adapter weight, gathered whole under FSDP2."""
    full = lambda p: p.full_tensor() if hasattr(p, "full_tensor") else p  # noqa: E731
    return {n: full(p).detach().sum().item() for n, p in module.policy.named_parameters() if p.requires_grad}


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
