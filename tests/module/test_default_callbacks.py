"""GRPOModule.configure_callbacks: a plain Trainer logs the monitoring metrics; the user's callbacks win."""

from __future__ import annotations

from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor

from lightning_grpo import GRPOConfig, GRPOModule
from lightning_grpo.callbacks import AgentStats, CompletionStats, GroupRewardStats, ThroughputMonitor, default_callbacks
from lightning_grpo.config import SamplingConfig
from lightning_grpo.testing import build_tiny_model
from tests.callbacks.helpers import ListLogger
from tests.conftest import count_a, make_trainer, prompt_loader


def _fit(module, callbacks=(), logger=False):
    trainer = make_trainer(callbacks=list(callbacks), max_steps=1, log_every_n_steps=1, logger=logger)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="]))
    return trainer


def test_a_plain_trainer_logs_the_reward_and_the_completion_metrics(make_module):
    logger = ListLogger()
    trainer = _fit(make_module(), logger=logger)
    names = {name for metrics, _ in logger.logged for name in metrics}
    assert {"train/reward_mean", "train/group/adv_std", "train/completion/eos_frac", "train/time/iteration"} <= names
    kinds = [type(callback) for callback in trainer.callbacks]
    assert [kind for kind in kinds if kind in (GroupRewardStats, CompletionStats, AgentStats)] == [
        GroupRewardStats, CompletionStats, AgentStats,
    ]  # fmt: skip
    assert [type(c) for c in default_callbacks()] == [k for k in kinds if k in {type(c) for c in default_callbacks()}]


def test_a_callback_of_the_same_type_given_to_the_trainer_wins(make_module):
    mine, lightning_throughput = GroupRewardStats(prefix="mine/"), LightningThroughputMonitor(batch_size_fn=len)
    trainer = make_trainer(callbacks=[mine, lightning_throughput], max_steps=1, logger=False)
    module = make_module()
    module.trainer = trainer
    added = [type(callback) for callback in module.configure_callbacks()]
    assert GroupRewardStats not in added and CompletionStats in added
    assert ThroughputMonitor not in added  # a subclass of the trainer's: Lightning would have replaced the user's
    assert [c for c in trainer.callbacks if isinstance(c, GroupRewardStats)] == [mine]


def test_one_setting_turns_the_defaults_off(tokenizer):
    grpo = GRPOConfig(sampling=SamplingConfig(num_generations=4, max_new_tokens=6, max_prompt_length=16))
    module = GRPOModule(build_tiny_model(tokenizer), [count_a], tokenizer=tokenizer, grpo=grpo, default_callbacks=False)
    trainer = _fit(module)
    assert not any(isinstance(callback, GroupRewardStats) for callback in trainer.callbacks)
    assert "train/reward_mean" not in trainer.callback_metrics and "train/loss" in trainer.callback_metrics
