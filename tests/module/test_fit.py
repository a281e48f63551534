"""Short ``Trainer.fit`` runs that exercise every setting, validation, gradient checkpointing and learning."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_grpo import PolicyConfig, PromptDataModule
from lightning_grpo.config import AdvantageConfig, ObjectiveConfig, UpdateConfig, ValidationConfig
from lightning_grpo.rewards import math_answer
from tests.conftest import make_trainer, prompt_records, tiny_sampling

SETTINGS = {
    "clip-defaults": {},
    "gspo-rloo": {
        "objective": ObjectiveConfig(loss_kind="gspo", clip_low=3e-4, clip_high=4e-4, kl_estimator="k1+", kl_coef=0.05,
                                     loss_agg_mode="seq-mean-token-mean"),
        "advantages": AdvantageConfig(advantage_estimator="rloo"), "sampling": tiny_sampling(top_k=5),
    },
    "cispo-reinforce": {
        "objective": ObjectiveConfig(loss_kind="cispo", loss_agg_mode="token-sum", entropy_coef=0.01,
                                     mask_truncated_completions=True, kl_coef=0.0),
        "advantages": AdvantageConfig(advantage_estimator="reinforce_pp_baseline"),
        "sampling": tiny_sampling(top_p=0.9, temperature=0.7, sampler="inverse_cdf", drop_finished=True),
    },
    "clip-higher-several-updates": {
        "objective": ObjectiveConfig(clip_high=0.28, dual_clip=None, delta=4.0, kl_estimator="abs",
                                     loss_agg_mode="seq-mean-token-sum-norm"),
        "advantages": AdvantageConfig(advantage_scale="batch"),
        "update": UpdateConfig(ppo_epochs=2, mini_batch_size=6, micro_batch_size=2, max_grad_norm=None),
        "sampling": tiny_sampling(num_generations=4, max_new_tokens=4),
    },
    "dr-grpo": {
        "advantages": AdvantageConfig(advantage_scale="none"),
        "objective": ObjectiveConfig(loss_agg_mode="seq-mean-token-sum", kl_estimator="mse+"),
        "update": UpdateConfig(micro_batch_size=3, fused_head=False), "sampling": tiny_sampling(share_prompt=False),
    },
}  # fmt: skip


class Record(Callback):
    """Keeps every training_step output."""

    def __init__(self) -> None:
        self.outputs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.outputs.append(outputs)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_fit_runs_with_every_setting(make_module, name):
    policy = PolicyConfig(
        lora_r=2, lora_alpha=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], dtype="float32"
    )
    module = make_module(policy=policy, **SETTINGS[name])
    record = Record()
    trainer = make_trainer(max_steps=4, callbacks=[record])
    trainer.fit(module, PromptDataModule(prompt_records(8), batch_size=3))
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/pg_loss", "train/zero_std_frac", "train/clip_frac", "train/entropy"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    assert ("train/kl" in metrics) == (module.config.objective.kl_coef > 0)
    out = record.outputs[-1]
    g = module.config.sampling.num_generations
    assert (
        len(out["rollout"]) == 3 * g and out["rollout"].completion_ids.shape[1] <= module.config.sampling.max_new_tokens
    )
    assert set(out["timings"]) >= {"generate", "score", "update"}
    several_updates = module.config.update.ppo_epochs > 1 or module.config.update.mini_batch_size is not None
    assert ("old_logprobs" in out["timings"]) == several_updates  # skipped when each rollout serves one update
    assert ("reference" in out["timings"]) == (module.config.objective.kl_coef > 0)


def test_gradient_checkpointing_gives_the_same_update(make_module):
    weights = []
    for checkpointing in (False, True):
        module = make_module(policy=PolicyConfig(lora_r=4, lora_alpha=8, gradient_checkpointing=checkpointing))
        make_trainer(max_steps=2).fit(module, PromptDataModule(prompt_records(8), batch_size=2))
        weights.append({n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad})
        assert module.policy.base_model.model.is_gradient_checkpointing == checkpointing
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=1e-6, rtol=1e-5)


def test_validation_logs_reward_accuracy_and_pass_at_k(make_module):
    module = make_module(
        reward_funcs=[math_answer],
        validation=ValidationConfig(num_generations=3),
        sampling=tiny_sampling(max_new_tokens=3),
    )
    data = PromptDataModule(prompt_records(8), val_data=prompt_records(4), batch_size=2, val_batch_size=2)
    trainer = make_trainer(max_steps=1, limit_val_batches=2, val_check_interval=1)
    trainer.fit(module, data)
    metrics = trainer.callback_metrics
    for key in ("val/reward_mean", "val/accuracy", "val/pass@3"):
        assert key in metrics and 0.0 <= float(metrics[key]) <= 1.0
    assert float(metrics["val/pass@3"]) >= float(metrics["val/accuracy"])


@pytest.mark.learning
def test_mean_reward_rises_on_a_tiny_task():
    """Learning test: reward = fraction of 'a' in the completion; a random tiny model starts near 1/96.

    ``python -m benchmarks.learning --cases count_a`` runs the same function for 3 seeds under 3 CPU capabilities
    (docs/benchmarks.md, "Learning"): the rise is 0.74-0.82 there, so 0.3 leaves a wide margin.
    """
    from benchmarks.learning import count_a_curve

    curve = count_a_curve(seed=0)
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    print(f"learning curve: {first:.3f} -> {last:.3f} over {len(curve)} steps")
    assert last > first + 0.3, f"mean reward should rise by > 0.3: {first:.3f} -> {last:.3f}"
    assert not math.isnan(last)
