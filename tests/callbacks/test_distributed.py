"""The callbacks under 2-process DDP on CPU (gloo): every logged value is global and the same on both ranks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback

from lightning_grpo.callbacks import AdapterExport, CompletionStats, GroupRewardStats, SampleLogger, ThroughputMonitor
from tests.callbacks.helpers import first_char_code
from tests.conftest import make_trainer, prompt_loader, tiny_sampling

pytestmark = pytest.mark.distributed


def rank_zero_only(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    """Applies on rank 0 only: on rank 1 its mean is undefined, which must not spoil the global mean."""
    return [float(len(c)) if torch.distributed.get_rank() == 0 else None for c in completions]


class Dump(Callback):
    """Each rank saves its step outputs and the metrics it ended the step with."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rollout = outputs["rollout"]
        record = {
            "rewards": outputs["rewards"].rewards, "per_function": outputs["rewards"].per_function,
            "group_ids": rollout.group_ids, "advantages": outputs["advantages"], "lengths": rollout.completion_lengths,
            "truncated": rollout.truncated, "tokens": rollout.completion_mask.sum(), "timings": outputs["timings"],
            "metrics": dict(trainer.callback_metrics),
        }  # fmt: skip
        torch.save(record, self.workdir / f"rank{trainer.global_rank}-{batch_idx}.pt")


def _group_summary(ranks: list[dict]) -> dict[str, float]:
    """zero_std_frac and within_var over both ranks' groups, by hand."""
    groups = []
    for record in ranks:
        for g in record["group_ids"].unique():
            r = record["rewards"][record["group_ids"] == g]
            groups.append(r[~torch.isnan(r)])
    spread = [r.var().item() for r in groups if len(r) > 1]
    return {
        "zero_std_frac": sum(len(r.unique()) <= 1 for r in groups) / len(groups),  # logged by the module
        "group/within_var": sum(spread) / len(spread),
    }


def test_logged_values_are_global_and_equal_on_every_rank(make_module, tmp_path):
    module = make_module((first_char_code, rank_zero_only), sampling=tiny_sampling(num_generations=4))
    callbacks = [GroupRewardStats(), CompletionStats(), ThroughputMonitor(), SampleLogger(every_n_iterations=1)]
    callbacks += [AdapterExport(dirpath=tmp_path / "out", every_n_iterations=1), Dump(tmp_path)]
    trainer = make_trainer(devices=2, strategy="ddp_fork", max_epochs=1, log_every_n_steps=1, callbacks=callbacks)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="], repeat=2))  # one batch of 2 prompts per rank
    ranks = [torch.load(tmp_path / f"rank{r}-0.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["metrics"].keys() == ranks[1]["metrics"].keys()
    for name, value in ranks[0]["metrics"].items():
        torch.testing.assert_close(ranks[1]["metrics"][name], value, msg=name)  # every metric is reduced
    logged = ranks[0]["metrics"]

    rewards = torch.cat([r["rewards"] for r in ranks])
    odd = torch.cat([r["per_function"]["rank_zero_only"] for r in ranks])
    assert torch.isnan(ranks[1]["per_function"]["rank_zero_only"]).all()  # no data on rank 1
    expected = {
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std().item(),
        "reward/rank_zero_only": odd.nanmean().item(),
        "reward/first_char_code": torch.cat([r["per_function"]["first_char_code"] for r in ranks]).mean().item(),
        **_group_summary(ranks),
        "completion/length_min": min(r["lengths"].min().item() for r in ranks),
        "completion/length_max": max(r["lengths"].max().item() for r in ranks),
        "completion/truncated_frac": torch.cat([r["truncated"] for r in ranks]).float().mean().item(),
        "throughput/generated_tokens_per_sec": sum(r["tokens"].item() / r["timings"]["generate"] for r in ranks),
        "time/update": max(r["timings"]["update"] for r in ranks),
    }
    for name, value in expected.items():
        assert math.isfinite(value)
        torch.testing.assert_close(logged[f"train/{name}"], torch.tensor(float(value)), msg=name)
    assert sorted(p.name for p in (tmp_path / "out" / "adapter").iterdir()) == ["final", "step-1"]
