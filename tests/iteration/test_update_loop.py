"""The update loop takes the module's overridable methods as callables: overrides are used, the context is built once
per iteration (docs/api/iteration.md)."""

from __future__ import annotations

import torch

from lightning_grpo import GRPOModule, PromptDataModule, UpdateBatch
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from lightning_grpo.rollout import TokenLogProbs
from tests.conftest import make_trainer, prompt_records


def length(completions, **kwargs):
    """A reward that differs within groups, so that the updates move the adapter."""
    return [float(len(c)) for c in completions]


class Counting(GRPOModule):
    """Counts the calls of the steps the loop and the log-prob passes must reach through the subclass."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"iteration_context": 0, "compute_loss": 0, "reference": 0, "old": 0}

    def iteration_context(self):
        self.calls["iteration_context"] += 1
        return super().iteration_context()

    def compute_loss(self, batch: UpdateBatch, counts):
        self.calls["compute_loss"] += 1
        return super().compute_loss(batch, counts)

    def compute_logprobs(self, rollout, *, reference=False, with_entropy=False) -> TokenLogProbs:
        if not torch.is_grad_enabled():  # the fixed passes run without gradient
            self.calls["reference" if reference else "old"] += 1
        return super().compute_logprobs(rollout, reference=reference, with_entropy=with_entropy)


def test_the_loop_and_the_fixed_passes_use_the_overrides_and_one_context_per_iteration(make_module):
    module = make_module(
        reward_funcs=[length],
        module_cls=Counting,
        update=UpdateConfig(ppo_epochs=2, mini_batch_size=6, micro_batch_size=3),
        objective=ObjectiveConfig(kl_coef=0.01),
    )
    torch.manual_seed(0)
    make_trainer(max_steps=1).fit(module, PromptDataModule(prompt_records(6), batch_size=3))
    # 3 prompts x G=4 = 12 rows; 2 epochs x 2 mini-batches of 6, each 2 micro-batches of 3: 8 losses
    assert module.calls == {"iteration_context": 1, "compute_loss": 8, "reference": 4, "old": 4}
    assert module._context is None  # not kept past its step
