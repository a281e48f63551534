"""A rank of the 2-process run on one vLLM server: ``python -m tests.backends.vllm_server_worker URL WORKDIR``.

Each rank fits two DDP iterations sampling its own prompts from the server at URL, recording the adapter loads it
sent (only rank 0 should), the adapter each step sampled with, its prompts and the log-prob agreement.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch

import lightning_grpo.backends.vllm_server.backend as vllm_server
from tests.backends.vllm_helpers import PROMPTS, loader, vllm_module
from tests.distributed.worker import make_strategy, rank


def main(url: str, workdir: Path) -> None:
    torch.set_num_threads(1)
    loads: list[str] = []
    post = vllm_server.post_json

    def recording(address, body, *args, **kwargs):
        if address.endswith("/v1/load_lora_adapter"):
            loads.append(body["lora_name"])
        return post(address, body, *args, **kwargs)

    vllm_server.post_json = recording
    module, seen, adapters = (
        vllm_module(backend={"rollout_backend": "vllm_server", "rollout_backend_args": {"url": url}}),
        [],
        [],
    )
    record = L.pytorch.callbacks.LambdaCallback(
        on_train_batch_end=lambda t, m, out, *_: (seen.append(out), adapters.append(m.rollout_backend.adapter))
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=make_strategy("ddp"), max_steps=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[record],
    )  # fmt: skip
    trainer.fit(module, loader(PROMPTS, repeat=8))
    result = {
        "loads": loads,
        "adapters": adapters,
        "prompts": [out["rollout"].prompts for out in seen],
        "diff_max": [float(out["metrics"]["rollout_logprob_diff_max"]) for out in seen],
    }
    (workdir / f"rank{rank()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
