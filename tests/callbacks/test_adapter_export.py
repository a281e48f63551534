"""AdapterExport: periodic and final PEFT exports that load back, rank-zero writing, and the all-ranks hook."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel

from lightning_grpo.callbacks import AdapterExport
from lightning_grpo.config import UpdateConfig
from lightning_grpo.testing import build_tiny_model
from tests.callbacks.helpers import first_char_code, fit
from tests.conftest import make_trainer, prompt_loader


def _lora(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters() if "lora_" in name}


def test_exports_every_n_iterations_and_at_the_end_and_they_load(make_module, tokenizer, tmp_path):
    module = make_module((first_char_code,))  # a reward with variance: the adapter moves every step
    fit(module, [AdapterExport(dirpath=tmp_path, every_n_iterations=2)], iterations=4)
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
    module = make_module(update=UpdateConfig(mini_batch_size=4))
    fit(module, [AdapterExport(every_n_iterations=1)], iterations=2, default_root_dir=tmp_path)
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
    trainer = make_trainer(max_epochs=1, callbacks=[AdapterExport(tmp_path, every_n_iterations=2)])
    trainer.fit(make_module(), train_dataloaders=loader)
    assert not (tmp_path / "adapter" / "step-1").exists()
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    resumed = AdapterExport(tmp_path, every_n_iterations=2)
    make_trainer(max_epochs=2, callbacks=[resumed]).fit(make_module(), loader, ckpt_path=tmp_path / "one.ckpt")
    assert resumed.iterations == 2 and (tmp_path / "adapter" / "step-2").exists()


def test_a_checkpoint_saved_before_the_rename_resumes_with_its_count(make_module, tmp_path):
    # The argument was every_n_steps when the checkpoint was saved (docs/glossary.md): its state key says so.
    loader = prompt_loader(["1+1=", "2+2="])
    trainer = make_trainer(max_epochs=1, callbacks=[AdapterExport(tmp_path, every_n_iterations=2)])
    trainer.fit(make_module(), train_dataloaders=loader)
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    checkpoint = torch.load(tmp_path / "one.ckpt", weights_only=False)
    states = checkpoint["callbacks"]
    (key,) = [k for k in states if k.startswith("AdapterExport")]
    states[key.replace("'every_n_iterations':", "'every_n_steps':")] = states.pop(key)
    torch.save(checkpoint, tmp_path / "old.ckpt")
    resumed = AdapterExport(tmp_path, every_n_iterations=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(max_epochs=2, callbacks=[resumed]).fit(make_module(), loader, ckpt_path=tmp_path / "old.ckpt")
    assert resumed.iterations == 2 and (tmp_path / "adapter" / "step-2").exists()  # its folder kept, no refusal
    assert not [w for w in caught if "add the following callbacks" in str(w.message)]


def test_a_module_without_export_adapter_is_refused():
    with pytest.raises(TypeError, match="AdapterExport needs a module with export_adapter"):
        AdapterExport().setup(None, torch.nn.Linear(1, 1), "fit")


@pytest.mark.parametrize("every", [0, -1, 1.5, "10"])
def test_bad_every_n_iterations_is_refused(every):
    with pytest.raises(ValueError, match=r"every_n_iterations must be an integer >= 1 or None, got"):
        AdapterExport(every_n_iterations=every)


def test_a_rerun_never_replaces_an_earlier_runs_adapter(make_module, tmp_path):
    fit(make_module(), [AdapterExport()], iterations=1, default_root_dir=tmp_path)  # no logger: default_root_dir
    fit(make_module(), [AdapterExport()], iterations=1, default_root_dir=tmp_path)  # the rerun goes beside it
    assert sorted(path.name for path in tmp_path.iterdir()) == ["adapter", "adapter_1"]
    assert (tmp_path / "adapter_1" / "final" / "adapter_config.json").exists()
    with pytest.raises(FileExistsError, match=rf"{tmp_path / 'adapter'} already holds adapter exports .*overwrite"):
        fit(make_module(), [AdapterExport(dirpath=tmp_path)], iterations=1)  # a folder the user chose: refused
    fit(make_module(), [AdapterExport(dirpath=tmp_path, overwrite=True)], iterations=1)


def test_with_a_logger_exports_go_to_the_runs_versioned_folder(make_module, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    for version in (0, 1):
        fit(make_module(), [AdapterExport()], iterations=1, logger=CSVLogger(tmp_path, name="run"))
        assert (tmp_path / "run" / f"version_{version}" / "adapter" / "final" / "adapter_config.json").exists()


def test_an_unwritable_folder_fails_before_the_first_iteration(make_module, tmp_path):
    (tmp_path / "a_file").write_text("")
    calls = []
    module = make_module((lambda prompts, completions, **_: calls.append(1) or [0.0] * len(completions),))
    with pytest.raises(PermissionError, match=r"AdapterExport cannot write to .*a_file/adapter.*set its dirpath"):
        fit(module, [AdapterExport(dirpath=tmp_path / "a_file")], iterations=1)
    assert not calls  # nothing was sampled or scored


def test_a_failed_final_export_saves_the_adapter_elsewhere_and_says_where(make_module, tmp_path, monkeypatch):
    module = make_module()
    export = module.export_adapter

    def fails_in_the_run_folder(path):
        if str(path).startswith(str(tmp_path)):
            raise PermissionError(13, "Permission denied", str(path))
        return export(path)

    monkeypatch.setattr(module, "export_adapter", fails_in_the_run_folder)
    with pytest.raises(
        OSError, match=r"could not write .*final \(.*Permission denied.*\); the adapter was saved to"
    ) as error:
        fit(module, [AdapterExport(dirpath=tmp_path)], iterations=1)
    fallback = Path(str(error.value).rsplit(" saved to ", 1)[1])
    assert (fallback / "adapter_config.json").exists() and not str(fallback).startswith(str(tmp_path))
