"""Checkpoints hold the adapter only; resuming continues exactly; the PEFT export reloads to the same model."""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from peft import PeftModel

from lightning_grpo import PromptDataModule
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, prompt_records


def _scheduler(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def _adapter(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


def _data():
    return PromptDataModule(prompt_records(8), batch_size=2, seed=1)  # 4 steps per epoch


def test_checkpoint_holds_only_the_adapter_and_resume_matches_an_uninterrupted_run(make_module, tmp_path):
    settings = {
        "lr_scheduler": _scheduler,
        "objective": ObjectiveConfig(kl_coef=0.01),
        "update": UpdateConfig(ppo_epochs=2, mini_batch_size=4),
    }
    straight = make_module(**settings)
    make_trainer(max_steps=24).fit(straight, _data())  # 6 iterations x 4 optimizer steps; crosses an epoch

    first = make_module(**settings)
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, save_last=True, every_n_train_steps=4
    )  # after iteration 1 of 4: mid-epoch
    make_trainer(max_steps=4, enable_checkpointing=True, callbacks=[checkpoint]).fit(first, _data())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["state_dict"] and all("lora_" in key for key in saved["state_dict"])
    assert saved["global_step"] == 4 and saved["lr_schedulers"]

    resumed = make_module(**settings)  # a fresh process would build the same module, then restore
    trainer = make_trainer(max_steps=24)
    trainer.fit(resumed, _data(), ckpt_path=tmp_path / "last.ckpt")
    assert trainer.global_step == 24
    for name, value in _adapter(straight).items():
        torch.testing.assert_close(_adapter(resumed)[name], value, atol=1e-6, rtol=1e-5)
    lrs = [opt.param_groups[0]["lr"] for opt in (straight.optimizers().optimizer, resumed.optimizers().optimizer)]
    assert lrs[0] == lrs[1] == 1e-2 * 0.5**6  # one scheduler step per GRPO iteration


def test_exported_adapter_reloads_and_merges_to_the_trained_policy(make_module, tokenizer, tmp_path):
    module = make_module()
    make_trainer(max_steps=2).fit(module, _data())
    path = module.export_adapter(tmp_path / "adapter")
    assert (path / "adapter_config.json").exists() and (path / "adapter_model.safetensors").exists()

    merged = PeftModel.from_pretrained(build_tiny_model(tokenizer), str(path)).merge_and_unload().eval()
    ids = tokenizer(["3+4=7", "1+1="], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = module.policy.eval()(**ids).logits
        got = merged(**ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
