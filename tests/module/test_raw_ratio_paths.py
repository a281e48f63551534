"""Issue 65 item 1 in a training step, for each sampling path of the ``hf`` backend: with top-k, top-p and min-p the
behaviour log-probs and the trainer's are on the same kept set, so ``train/rollout_ratio_raw_mean`` (taken at the
weights that sampled, before any cap or mask) is 1 within 1e-3; without the kept log mass it would be the kept mass.

Paths: ``generate`` (the default), our eager loop with each sampler (``multinomial`` with ``drop_finished``,
``inverse_cdf``), the compiled step, and the turn cache of a multi-turn run. The vLLM paths are in
``tests/backends/test_vllm_truncation.py``.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import AgentConfig, CorrectionConfig, ObjectiveConfig, SamplingConfig
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model
from tests.conftest import make_trainer, prompt_loader, tiny_sampling

TRUNCATION = {"temperature": 0.9, "top_p": 0.8, "top_k": 20, "min_p": 0.05}
PATHS = {
    "generate": {},
    "eager multinomial, drop_finished": {"drop_finished": True},
    "eager inverse_cdf": {"sampler": "inverse_cdf"},
    "compiled": {"decode": "compiled"},
}


class _Keep(Callback):
    """Keeps each iteration's rollout and the metrics logged for it."""

    def __init__(self) -> None:
        self.rollouts, self.metrics = [], []

    def on_train_batch_end(self, trainer, module, outputs, *_):
        self.rollouts.append(outputs["rollout"])
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})


def _fit(module: GRPOModule, loader) -> _Keep:
    keep = _Keep()
    make_trainer(max_steps=1, callbacks=[keep]).fit(module, train_dataloaders=loader)
    return keep


def _cut_share(rollout) -> float:
    """The share of sampled tokens whose kept set left part of the vocabulary out (a finite margin)."""
    mask = rollout.sampled_mask.bool() & rollout.completion_mask.bool()
    return float(rollout.kept_margins[mask].isfinite().float().mean())


@pytest.mark.parametrize("path", list(PATHS))
def test_the_raw_ratio_is_one_on_every_hf_path(make_module, path):
    sampling = tiny_sampling(max_new_tokens=8, **TRUNCATION, **PATHS[path])
    module = make_module(sampling=sampling, objective=ObjectiveConfig(kl_coef=0.0))
    keep = _fit(module, prompt_loader(["1+1=", "2+5="]))
    rollout, metrics = keep.rollouts[0], keep.metrics[0]
    assert rollout.kept_margins is not None and _cut_share(rollout) > 0  # the sets were cut somewhere
    assert abs(metrics["train/rollout_ratio_raw_mean"] - 1) < 1e-3
    assert metrics["train/rollout_logprob_diff_max"] < 1e-3


def test_the_raw_ratio_is_one_through_the_turn_cache(tokenizer):
    sampling = SamplingConfig(num_generations=2, max_new_tokens=60, max_prompt_length=32, **TRUNCATION)
    grpo = GRPOConfig(sampling=sampling, agents=AgentConfig(max_turns=3, turn_cache=True),
                      objective=ObjectiveConfig(kl_coef=0.0))  # fmt: skip
    module = GRPOModule(
        short_turn_model(tokenizer), [lambda completions, env_reward, **_: [float(r) for r in env_reward]],
        tokenizer=tokenizer, policy=PolicyConfig(lora_r=4, lora_alpha=8), grpo=grpo, environment_factory=CountdownEnv,
    )  # fmt: skip
    prompts = [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play"}]]
    loader = torch.utils.data.DataLoader(
        [{"prompt": prompts, "turns": [2, 3]}], batch_size=None, collate_fn=lambda batch: batch
    )
    keep = _fit(module, loader)
    rollout, metrics = keep.rollouts[0], keep.metrics[0]
    assert rollout.turns is not None and int(rollout.turns.num_turns.max()) >= 2  # several turns were sampled
    assert rollout.kept_margins is not None
    assert abs(metrics["train/rollout_ratio_raw_mean"] - 1) < 1e-3


def test_without_truncation_nothing_is_recorded_and_the_ratio_is_one(make_module):
    module = make_module(sampling=tiny_sampling(max_new_tokens=8), objective=ObjectiveConfig(kl_coef=0.0))
    keep = _fit(module, prompt_loader(["1+1=", "2+5="]))
    assert keep.rollouts[0].kept_margins is None
    assert abs(keep.metrics[0]["train/rollout_ratio_raw_mean"] - 1) < 1e-4


def test_a_correction_sees_no_kept_mass(make_module):
    corrections = CorrectionConfig(rollout_correction="token_mask", rollout_correction_args={"min": 0.99, "max": 1.01})
    sampling = tiny_sampling(max_new_tokens=8, **TRUNCATION)
    module = make_module(sampling=sampling, objective=ObjectiveConfig(kl_coef=0.0), corrections=corrections)
    metrics = _fit(module, prompt_loader(["1+1=", "2+5="])).metrics[0]
    assert metrics["train/rollout_is_masked_frac"] == 0  # a ratio carrying the kept mass (< 0.99) would be masked
    assert abs(metrics["train/rollout_is_weight_mean"] - 1) < 1e-3
