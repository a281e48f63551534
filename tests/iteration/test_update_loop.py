"""The update loop takes the module's steps as callables: overrides are used, the context is built once per step,
and the names that moved still import from their old paths with a warning (docs/api/iteration.md)."""

from __future__ import annotations

import importlib
import warnings
from dataclasses import replace

import pytest
import torch

from lightning_grpo import GRPOModule, PromptDataModule, UpdateBatch, _moved
from lightning_grpo.algorithms.importance import importance_weighted, rollout_agreement
from lightning_grpo.rollout import TokenLogProbs
from tests.conftest import make_trainer, prompt_records

SEVERAL_UPDATES = {"ppo_epochs": 2, "mini_batch_size": 6, "kl_coef": 0.01}


def length(completions, **kwargs):
    """A reward that differs within groups, so that the updates move the adapter."""
    return [float(len(c)) for c in completions]


class Counting(GRPOModule):
    """Counts the calls of the steps the loop and the log-prob passes must reach through the subclass."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"step_context": 0, "compute_loss": 0, "reference": 0, "old": 0}

    def step_context(self):
        self.calls["step_context"] += 1
        return super().step_context()

    def compute_loss(self, batch: UpdateBatch, counts):
        self.calls["compute_loss"] += 1
        return super().compute_loss(batch, counts)

    def compute_logprobs(self, rollout, *, reference=False, with_entropy=False) -> TokenLogProbs:
        if not torch.is_grad_enabled():  # the fixed passes run without gradient
            self.calls["reference" if reference else "old"] += 1
        return super().compute_logprobs(rollout, reference=reference, with_entropy=with_entropy)


def test_the_loop_and_the_fixed_passes_use_the_overrides_and_one_context_per_step(make_module):
    module = make_module(reward_funcs=[length], module_cls=Counting, micro_batch_size=3, **SEVERAL_UPDATES)
    torch.manual_seed(0)
    make_trainer(max_steps=1).fit(module, PromptDataModule(prompt_records(6), batch_size=3))
    # 3 prompts x G=4 = 12 rows; 2 epochs x 2 mini-batches of 6, each 2 micro-batches of 3: 8 losses
    assert module.calls == {"step_context": 1, "compute_loss": 8, "reference": 4, "old": 4}
    assert module._context is None  # not kept past its step


@pytest.mark.parametrize(
    ("old_path", "name", "new_path"),
    [
        ("lightning_grpo.iteration.update", "MetricSums", "lightning_grpo.metrics.MetricSums"),
        ("lightning_grpo.iteration.update", "importance_weighted", "lightning_grpo.algorithms.importance"),
        ("lightning_grpo.iteration.update", "rollout_agreement", "lightning_grpo.algorithms.importance"),
        ("lightning_grpo.iteration.context", "StepModule", "lightning_grpo.GRPOModule"),
        ("lightning_grpo.step", "StepModule", "lightning_grpo.GRPOModule"),
    ],
)
def test_moved_names_import_from_their_old_path_with_one_warning_naming_the_new(old_path, name, new_path):
    module = importlib.import_module(old_path)
    _moved.WARNED.discard(f"{old_path}.{name}")
    with pytest.warns(DeprecationWarning, match=new_path.replace(".", r"\.")):
        first = getattr(module, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(module, name) is first  # once
    with pytest.raises(AttributeError):
        module.not_a_name  # noqa: B018


def test_the_old_signatures_give_the_pure_functions_results(make_module):
    module = make_module(reward_funcs=[length])
    rollout = module.generate({"prompt": ["ab", "ba"]})
    batch = module.prepare_update(rollout, torch.ones(len(rollout)))
    behaviour, mask = rollout.logprobs, batch.loss_mask
    with pytest.warns(DeprecationWarning):
        from lightning_grpo.iteration import update

        _moved.WARNED.difference_update(
            {f"{update.__name__}.importance_weighted", f"{update.__name__}.rollout_agreement"}
        )
        old_weighted, old_agreement = update.importance_weighted, update.rollout_agreement
    per_token = torch.ones_like(behaviour)
    expected = importance_weighted(per_token, behaviour - 1.0, behaviour, mask, cap=2.0)
    torch.testing.assert_close(old_weighted(per_token, batch, behaviour - 1.0, 2.0), expected)
    first = replace(batch, at_sampling_weights=True)  # the step's first mini-batch
    torch.testing.assert_close(
        old_agreement(first, behaviour + 0.5), rollout_agreement(behaviour + 0.5, behaviour, mask)
    )
    assert old_agreement(batch, behaviour) == {}  # later mini-batches: not measured
