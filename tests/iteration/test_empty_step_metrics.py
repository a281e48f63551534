"""A step without a loss token on any rank logs no ``*_min`` / ``*_max`` metric (no infinity, no meaningless 0), and
learning this from the non-finite guard's host copy costs no host sync (issue 66)."""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from lightning.pytorch import Callback
from torch import nn

import lightning_grpo.iteration.update as update_loop
from lightning_grpo import GRPOModule
from lightning_grpo.config import CorrectionConfig, GRPOConfig, UpdateConfig
from lightning_grpo.iteration import UpdateBatch
from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.iteration.nonfinite import step_is_finite
from lightning_grpo.iteration.update import run_updates
from lightning_grpo.testing.dispatch import DispatchCounter
from tests.conftest import make_trainer, prompt_loader, tiny_sampling
from tests.module.helpers import fixed_rollout

EXTREMA = ("train/rollout_is_weight_min", "train/rollout_is_weight_max")


class EmptyFirstStep(GRPOModule):
    """The first step's loss mask is empty on every row (as when every completion is truncated and masked)."""

    def prepare_update(self, rollout, advantages):
        batch = super().prepare_update(rollout, advantages)
        if self.global_step == 0:
            batch = UpdateBatch(**{**batch.__dict__, "loss_mask": torch.zeros_like(batch.loss_mask)})
        return batch


class Logged(Callback):
    """Each step's logged metrics, as floats."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({name: float(value) for name, value in trainer.callback_metrics.items()})


def test_an_empty_step_logs_no_extremum_and_a_normal_step_does(make_module):
    module = make_module(
        module_cls=EmptyFirstStep,
        update=UpdateConfig(micro_batch_size=2),
        corrections=CorrectionConfig(rollout_correction="token_truncate", rollout_correction_args={"max": 3.0}),
    )
    logged = Logged()
    make_trainer(max_steps=2, callbacks=[logged]).fit(module, prompt_loader(["1+1=", "2+3="]))
    empty, normal = logged.steps
    assert not set(EXTREMA) & empty.keys()
    assert "train/rollout_is_weight_mean" in empty and "train/loss" in empty  # the means are still logged
    assert all(math.isfinite(value) for value in empty.values()), empty
    assert set(EXTREMA) <= normal.keys() and all(math.isfinite(normal[name]) for name in EXTREMA)


class _Optimizer:
    """The part of a LightningOptimizer the update loop uses."""

    def __init__(self, parameters) -> None:
        self.inner = torch.optim.SGD(parameters, lr=0.1)

    @contextmanager
    def toggle_model(self, sync_grad: bool = True):
        yield

    def step(self) -> None:
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


def _updates(tokenizer, loss_mask_scale: float) -> tuple[DispatchCounter, dict[str, torch.Tensor]]:
    """Host syncs and metrics of ``run_updates`` over 4 rows in 2 mini-batches, with a loss that syncs nothing."""
    rollout = fixed_rollout(tokenizer, ["1+1="] * 2 + ["2+3="] * 2, ["aab", "b", "aaaa", "ba"], group_size=2)
    batch = UpdateBatch(rollout, torch.linspace(-1, 1, 4), rollout.completion_mask.float() * loss_mask_scale)
    policy = nn.Linear(1, 1)
    config = GRPOConfig(sampling=tiny_sampling(num_generations=2), update=UpdateConfig(mini_batch_size=2))
    context = IterationContext(
        device=torch.device("cpu"),
        global_step=0,
        seed=0,
        grad_scale=1.0,
        sum_across_ranks=lambda value: value,
        log=lambda *a, **k: None,
        timer=None,
        warned=set(),
        skipped=[],
    )

    def compute_loss(part, counts):
        weights = torch.where(part.loss_mask > 0, part.advantages[:, None].exp(), math.inf)
        loss = (part.loss_mask * policy.weight).sum() / counts.num_tokens.clamp(min=1)
        return loss, {"pg_loss": loss, "kl": loss.detach(), "w_min": weights.amin(), "w_max": weights.amax()}

    with DispatchCounter() as counter:
        _, metrics = run_updates(
            batch,
            context,
            config,
            policy=policy,
            compute_loss=compute_loss,
            backward=lambda loss: loss.backward(),
            optimizer=_Optimizer(policy.parameters()),
            clip_gradients=lambda *a, **k: None,
        )
    return counter, metrics


def test_the_token_count_rides_on_the_guard_sync(tokenizer, monkeypatch):
    healthy, metrics = _updates(tokenizer, 1.0)
    assert {"w_min", "w_max", "kl"} <= metrics.keys() and math.isfinite(float(metrics["w_min"]))
    empty, metrics = _updates(tokenizer, 0.0)
    assert metrics.keys() == {"pg_loss", "kl"} and all(math.isfinite(float(v)) for v in metrics.values())
    plain = lambda context, flags, num_tokens, **guard: (step_is_finite(context, flags, **guard), 1.0)  # noqa: E731
    monkeypatch.setattr(update_loop, "step_is_finite_with_tokens", plain)  # the guard alone, as before the token count
    before, _ = _updates(tokenizer, 1.0)
    assert healthy.syncs == empty.syncs == before.syncs  # the CPU counter also counts the host-index reads
    assert "aten._local_scalar_dense.default" not in healthy.sync_ops  # no float(), item() or bool() of a tensor
