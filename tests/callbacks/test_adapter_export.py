"""AdapterExport: periodic and final PEFT exports that load back, rank-zero writing, and the all-ranks hook."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel

from lightning_grpo.callbacks import AdapterExport
from lightning_grpo.testing import build_tiny_model
from tests.callbacks.helpers import first_char_code, fit
from tests.conftest import make_trainer, prompt_loader


def _lora(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters() if "lora_" in name}


def test_exports_every_n_steps_and_at_the_end_and_they_load(make_module, tokenizer, tmp_path):
    module = make_module((first_char_code,))  # a reward with variance: the adapter moves every step
    fit(module, [AdapterExport(dirpath=tmp_path, every_n_steps=2)], iterations=4)
    root = tmp_path / "adapter"
    assert sorted(path.name for path in root.iterdir()) == ["final", "step-2", "step-4"]
    final = _lora(PeftModel.from_pretrained(build_tiny_model(tokenizer), root / "final"))
    assert final.keys() == _lora(module.policy).keys() and final
    for name, value in _lora(module.policy).items():
        torch.testing.assert_close(final[name], value, msg=name)
    at_step_2 = _lora(PeftModel.from_pretrained(build_tiny_model(tokenizer), root / "step-2"))
    assert any(not torch.equal(at_step_2[name], final[name]) for name in final)  # written mid-training


def test_directories_are_named_by_global_step_and_default_to_the_root_dir(make_module, tmp_path):
    # Two mini-batches per iteration: two optimizer steps, so iterations 1 and 2 end at global steps 2 and 4.
    module = make_module(mini_batch_size=4)
    fit(module, [AdapterExport(every_n_steps=1)], iterations=2, default_root_dir=tmp_path)
    assert sorted(path.name for path in (tmp_path / "adapter").iterdir()) == ["final", "step-2", "step-4"]


class _Module:
    def __init__(self, all_ranks: bool | None = None) -> None:
        self.paths: list[Path] = []
        if all_ranks is not None:
            self.export_adapter_all_ranks = all_ranks

    def export_adapter(self, path: Path) -> Path:
        self.paths.append(path)
        return path


def _trainer(is_global_zero: bool, barriers: list[str]) -> SimpleNamespace:
    strategy = SimpleNamespace(barrier=barriers.append)
    return SimpleNamespace(is_global_zero=is_global_zero, strategy=strategy, default_root_dir="root", global_step=3)


@pytest.mark.parametrize(
    ("is_global_zero", "all_ranks", "exports"),
    [(True, None, 1), (False, None, 0), (False, False, 0), (False, True, 1), (True, True, 1)],
)
def test_rank_zero_writes_unless_the_module_needs_every_rank(is_global_zero, all_ranks, exports):
    barriers: list[str] = []
    module = _Module(all_ranks)
    AdapterExport().on_train_end(_trainer(is_global_zero, barriers), module)
    assert module.paths == [Path("root/adapter/final")] * exports
    assert barriers == ["AdapterExport.final"]  # every rank waits, whether or not it wrote


def test_iteration_count_survives_a_checkpoint(make_module, tmp_path):
    # An epoch of one iteration, a checkpoint, then the resumed run's first iteration is the 2nd: it exports.
    loader = prompt_loader(["1+1=", "2+2="])
    trainer = make_trainer(max_epochs=1, callbacks=[AdapterExport(tmp_path, every_n_steps=2)])
    trainer.fit(make_module(), train_dataloaders=loader)
    assert not (tmp_path / "adapter" / "step-1").exists()
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    resumed = AdapterExport(tmp_path, every_n_steps=2)
    make_trainer(max_epochs=2, callbacks=[resumed]).fit(make_module(), loader, ckpt_path=tmp_path / "one.ckpt")
    assert resumed.iterations == 2 and (tmp_path / "adapter" / "step-2").exists()


def test_a_module_without_export_adapter_is_refused():
    with pytest.raises(TypeError, match="AdapterExport needs a module with export_adapter"):
        AdapterExport().setup(None, torch.nn.Linear(1, 1), "fit")


@pytest.mark.parametrize("every", [0, -1, 1.5, "10"])
def test_bad_every_n_steps_is_refused(every):
    with pytest.raises(ValueError, match=r"every_n_steps must be an int >= 1 or None, got"):
        AdapterExport(every_n_steps=every)
