"""SaveOnInterrupt: Ctrl-C saves a checkpoint of the last completed iteration and the adapter; it resumes."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.callbacks import AdapterExport, SaveOnInterrupt
from lightning_grpo.config import UpdateConfig
from tests.conftest import make_trainer, prompt_loader

PROMPTS = ["1+1=", "2+2="]


def _interrupted_at_iteration(n: int):
    """A reward function that raises KeyboardInterrupt (as Ctrl-C does) while scoring the n-th iteration."""
    calls = []

    def reward(prompts, completions, **_):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return [float(c.count("a")) for c in completions]

    return reward


def _adapter(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


def test_ctrl_c_saves_the_last_completed_iteration_and_the_adapter(make_module, tmp_path):
    module = make_module([_interrupted_at_iteration(3)])
    trainer = make_trainer(max_steps=5, default_root_dir=tmp_path, callbacks=[SaveOnInterrupt(), AdapterExport()])
    with pytest.raises(SystemExit):  # Lightning's graceful shutdown after on_exception
        trainer.fit(module, prompt_loader(PROMPTS, repeat=5))
    checkpoint = tmp_path / "checkpoints" / "interrupted-step=2.ckpt"  # two iterations completed
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["global_step"] == 2
    for name, value in _adapter(module).items():
        torch.testing.assert_close(saved["state_dict"][f"policy.{name}"], value)  # the adapter after iteration 2
    assert (tmp_path / "adapter" / "interrupted-step-2" / "adapter_config.json").exists()

    resumed = make_module([lambda prompts, completions, **_: [0.0] * len(completions)])
    trainer = make_trainer(max_steps=3)
    trainer.fit(resumed, prompt_loader(PROMPTS, repeat=5), ckpt_path=checkpoint)
    assert trainer.global_step == 3


def test_no_checkpoint_from_a_half_updated_iteration(make_module, tmp_path):
    module = make_module(update=UpdateConfig(mini_batch_size=4))  # two optimizer steps per iteration

    class StopBetweenSteps(torch.optim.AdamW):
        def zero_grad(self, set_to_none=True):
            raise KeyboardInterrupt  # after the first of the two steps has completed

    module.optimizer_factory = lambda params: StopBetweenSteps(params, lr=1e-2)
    trainer = make_trainer(max_steps=4, default_root_dir=tmp_path, callbacks=[SaveOnInterrupt()])
    with pytest.warns(UserWarning, match="partly updated"), pytest.raises(SystemExit):
        trainer.fit(module, prompt_loader(PROMPTS, repeat=2))
    assert not (tmp_path / "checkpoints").exists()


def test_other_exceptions_save_nothing(make_module, tmp_path):
    def broken(prompts, completions, **_):
        raise ValueError("boom")

    trainer = make_trainer(max_steps=2, default_root_dir=tmp_path, callbacks=[SaveOnInterrupt()])
    with pytest.raises(Exception, match="boom"):
        trainer.fit(make_module([broken]), prompt_loader(PROMPTS))
    assert not (tmp_path / "checkpoints").exists()
